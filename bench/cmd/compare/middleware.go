package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"time"

	"github.com/go-chi/httprate"
	sethhttp "github.com/sethvargo/go-limiter/httplimit"
	sethmem "github.com/sethvargo/go-limiter/memorystore"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/httplimit"
	"github.com/tollgate/tollgate/memorystore"
)

// The middleware rows serve requests through each library's HTTP
// middleware, in process (no network), from client addresses that all
// hold state already, under a limit no address comes near: 1,000,000 a
// second, so every request is admitted and the handler runs. What is
// measured is what the middleware costs a request on its usual path.
const mwRate = 1_000_000

// mwRow is one middleware: how to wrap the handler, and what it is.
type mwRow struct {
	name string
	// peer names the library for ratio columns; "" for tollgate's rows.
	peer string
	wrap func(next http.Handler) (http.Handler, error)
	note string
}

// middlewareRows are the middleware rows, each as a user sets it up for a
// limit per client address taken from RemoteAddr, with its defaults
// otherwise. None records metrics: tollgate's would need a registry
// (enforce.WithRegistry), which is left out as the peers have none.
func middlewareRows() []mwRow {
	return []mwRow{
		{name: "tollgate httplimit (memorystore, token bucket)", wrap: func(next http.Handler) (http.Handler, error) {
			lim, err := httplimit.New(memorystore.New(), []httplimit.Rule{{
				Name:     "api",
				Policies: []enforce.Policy{{Name: "api", Limit: tollgate.PerSecond(mwRate)}},
			}})
			if err != nil {
				return nil, err
			}
			return lim.Handler(next), nil
		}, note: "one rule keyed by httplimit.ClientIP (the default); a 50 ms store deadline; sets RateLimit-Policy and RateLimit"},
		{name: "sethvargo/go-limiter httplimit (memorystore)", peer: "sethvargo", wrap: func(next http.Handler) (http.Handler, error) {
			s, err := sethmem.New(&sethmem.Config{Tokens: mwRate, Interval: time.Second})
			if err != nil {
				return nil, err
			}
			m, err := sethhttp.NewMiddleware(s, sethhttp.IPKeyFunc())
			if err != nil {
				return nil, err
			}
			return m.Handle(next), nil
		}, note: "IPKeyFunc(); sets X-RateLimit-Limit, -Remaining and -Reset"},
		{name: "go-chi/httprate (local counter)", peer: "httprate", wrap: func(next http.Handler) (http.Handler, error) {
			return httprate.LimitBy(mwRate, time.Second, keyByRemoteAddr)(next), nil
		}, note: "LimitBy with its in-memory sliding window counter, keyed as its KeyByIP keys; sets X-RateLimit-Limit, -Remaining and -Reset"},
	}
}

// keyByRemoteAddr keys a request by its peer's address, as httprate's
// KeyByIP does (which its documentation now asks callers to spell out).
func keyByRemoteAddr(r *http.Request) (string, error) {
	ip, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		ip = r.RemoteAddr
	}
	return httprate.CanonicalizeIP(ip), nil
}

// mwHandler is the handler every middleware row serves: a small body, as
// an API's answer would be, written through the middleware's headers.
var mwHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
	w.Header()["Content-Type"] = jsonType
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(mwBody)
})

var (
	mwBody   = []byte(`{"ok":true}` + "\n")
	jsonType = []string{"application/json"} // shared, so that setting it allocates nothing
)

// mwRequests returns n GET requests from n client addresses, 10.0.0.0 up,
// each from a port of its own.
func mwRequests(n int) []*http.Request {
	rs := make([]*http.Request, n)
	for i := range rs {
		r := httptest.NewRequest(http.MethodGet, "/api/items", nil)
		r.RemoteAddr = "10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255) + ":" + strconv.Itoa(1024+i%60000)
		rs[i] = r
	}
	return rs
}

// recorder is a ResponseWriter kept by one goroutine across requests, as
// httptest.ResponseRecorder records a response, but reset between requests
// rather than made anew: its header map keeps its room, and the body is
// counted, not kept, so that the rows' allocations are the middleware's
// own (a server allocates its writer per connection, not per request, and
// its header map per request, the same for every row).
type recorder struct {
	h      http.Header
	status int
	body   int
}

func (w *recorder) Header() http.Header { return w.h }

func (w *recorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *recorder) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	w.body += len(b)
	return len(b), nil
}

// serveOne returns a function serving one request through h into a
// recorder of its own, failing unless the handler answered.
func serveOne(h http.Handler) func(context.Context, *http.Request) error {
	w := &recorder{h: http.Header{}}
	return func(_ context.Context, r *http.Request) error {
		h.ServeHTTP(w, r)
		status, body := w.status, w.body
		clear(w.h)
		w.status, w.body = 0, 0
		if status != http.StatusOK || body != len(mwBody) {
			return fmt.Errorf("status %d, %d bytes: the request was not admitted", status, body)
		}
		return nil
	}
}

// mwResult is one middleware row and its figures.
type mwResult struct {
	mwRow
	f memFigures
}

// middlewareTables measures the middleware rows over nips client
// addresses, taking turns chunk by chunk as the in-memory rows do, and
// prints their table, their ratios to the peers and how tollgate's row
// stands against the fastest peer and the goal.
func middlewareTables(out io.Writer, rows []mwRow, rounds, nips int) ([]mwResult, error) {
	g := runtime.GOMAXPROCS(0)
	reqs := mwRequests(nips)
	res := make([]mwResult, len(rows))
	cs := make([][2]*chunker, len(rows))
	defer closeChunkers(cs)
	names := make([]string, len(rows))
	for i, r := range rows {
		h, err := r.wrap(mwHandler)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.name, err)
		}
		// Every address holds state before anything is measured.
		serve := serveOne(h)
		for _, req := range reqs {
			if err := serve(context.Background(), req); err != nil {
				return nil, fmt.Errorf("%s: %w", r.name, err)
			}
		}
		res[i].mwRow, names[i] = r, r.name
		for m, n := range []int{1, g} {
			cs[i][m] = newChunker(reqs, func() func(context.Context, *http.Request) error { return serveOne(h) }, n)
		}
	}
	fs, err := interleave(names, cs, rounds)
	if err != nil {
		return nil, err
	}
	for i := range res {
		res[i].f = fs[i]
	}
	fmt.Fprintf(out, "### HTTP middleware: %d client addresses, every request admitted; serial and parallel (GOMAXPROCS=%d goroutines)\n\n", nips, g)
	fmt.Fprintf(out, "In process: each request is a prepared *http.Request (RemoteAddr 10.x.y.z:port) served by the middleware around one handler that writes a 12-byte JSON body, into a ResponseWriter reset between requests. ns/op and ratios as for the in-memory rows (%d chunks of about %v per row and mode, taking turns).\n\n", rounds*chunksPerRound, chunkTime)
	fmt.Fprintln(out, "| middleware | serial ns/op | serial allocs/op | parallel ns/op | parallel allocs/op | note |")
	fmt.Fprintln(out, "| --- | ---: | ---: | ---: | ---: | --- |")
	for _, r := range res {
		fmt.Fprintf(out, "| %s | %.0f | %.2f | %.0f | %.2f | %s |\n", r.name, r.f.serial.median(), r.f.serial.allocsPerOp(),
			r.f.parallel.median(), r.f.parallel.allocsPerOp(), r.note)
	}
	fmt.Fprintln(out)
	ratioTable(out, res, func(r mwResult) (string, string) { return r.name, r.peer }, "serial, parallel",
		func(r, p mwResult) (float64, float64) {
			return r.f.serial.pairedRatio(&p.f.serial), r.f.parallel.pairedRatio(&p.f.parallel)
		})
	return res, nil
}
