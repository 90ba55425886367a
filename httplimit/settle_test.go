package httplimit_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/httplimit"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
)

// meteredHandler answers with the status in the request's "status" query
// parameter (default 200) and reports the cost in its "used" parameters,
// each one a value of X-Tokens-Used, set before the body; "trailer"
// reports them as an announced trailer instead, "late" as an unannounced
// one (http.TrailerPrefix).
var meteredHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	code := http.StatusOK
	if s := q.Get("status"); s != "" {
		code, _ = strconv.Atoi(s)
	}
	used := q["used"]
	switch {
	case q.Has("trailer"):
		w.Header().Add("Trailer", "X-Tokens-Used")
		w.WriteHeader(code)
		_, _ = io.WriteString(w, "generated")
		w.Header()["X-Tokens-Used"] = used
	case q.Has("late"):
		w.WriteHeader(code)
		_, _ = io.WriteString(w, "generated")
		// Streamed: a response whose body was all written when the
		// handler returned gets a Content-Length, and no trailers.
		w.(http.Flusher).Flush()
		w.Header()[http.TrailerPrefix+"X-Tokens-Used"] = used
	default:
		if used != nil {
			w.Header()["X-Tokens-Used"] = used
		}
		w.WriteHeader(code)
		_, _ = io.WriteString(w, "generated")
	}
})

// tokenRule reserves an estimate of 4 under a token bucket of 10 a minute.
func tokenRule(s *httplimit.Settle) httplimit.Rule {
	return httplimit.Rule{
		Name:     "llm",
		Policies: []enforce.Policy{{Name: "tokens", Limit: tollgate.PerMinute(10)}},
		Cost:     func(*http.Request) int { return 4 },
		Settle:   s,
	}
}

// settleThenLook sends target, waits for its settle, and returns the
// response and what a look at the key reports as remaining afterwards (a
// second request of the rule, whose own estimate is then taken out).
func settleThenLook(t *testing.T, lim *httplimit.Limiter, h http.Handler, target string) (*httptest.ResponseRecorder, int64) {
	t.Helper()
	w := do(h, "GET", target, "192.0.2.1:1", nil)
	if err := lim.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	next := do(h, "GET", "/", "192.0.2.1:1", nil)
	return w, remaining(t, next.Header(), "tokens") + 4
}

// TestSettle: the real cost a response reports replaces the estimate of 4,
// as the next request of the key sees it, on both stores.
func TestSettle(t *testing.T) {
	t.Parallel()
	refund5xx := &httplimit.Settle{Header: "X-Tokens-Used", Refund: httplimit.ServerError}
	for _, tc := range []struct {
		name   string
		settle *httplimit.Settle
		target string
		want   int64 // remaining of 10 after the first request settled
	}{
		{"no header: the estimate stands", refund5xx, "/", 6},
		{"a refund on a 5xx", refund5xx, "/?status=503", 10},
		{"a refund on a 5xx whatever the header says", refund5xx, "/?status=500&used=7", 10},
		{"no refund on a 4xx", refund5xx, "/?status=404", 6},
		{"a header of less than the estimate", refund5xx, "/?used=1", 9},
		{"a header of 0", refund5xx, "/?used=0", 10},
		{"a header of more than the estimate", refund5xx, "/?used=6", 4},
		{"the header equal to the estimate", refund5xx, "/?used=4", 6},
		{"an announced trailer", refund5xx, "/?trailer&used=2", 8},
		{"an unannounced trailer", refund5xx, "/?late&used=2", 8},
		{"spaces around the number", refund5xx, "/?used=+2+", 8},
		{"hidden header", &httplimit.Settle{Header: "X-Tokens-Used", Hide: true}, "/?used=1", 9},
		{"hidden trailer", &httplimit.Settle{Header: "X-Tokens-Used", Hide: true}, "/?trailer&used=3", 7},
		{"a func of the status and headers", &httplimit.Settle{Func: func(status int, h http.Header) (int, bool) {
			n, err := strconv.Atoi(h.Get("X-Tokens-Used"))
			return n * 2, err == nil && status == 200
		}}, "/?used=3", 4},
		{"a func that does not know", &httplimit.Settle{Func: func(int, http.Header) (int, bool) { return 0, false }}, "/?used=1", 6},
		{"a refund only", &httplimit.Settle{Refund: func(status int) bool { return status == 409 }}, "/?status=409", 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eachBackend(t, func(t *testing.T, b testkit.Store) {
				store := b.New(t, newClock().Now)
				lim := mustNew(t, store, []httplimit.Rule{tokenRule(tc.settle)})
				h := lim.Handler(meteredHandler)
				w, got := settleThenLook(t, lim, h, tc.target)
				if w.Body.String() != "generated" {
					t.Fatalf("response %d %q, want the handler's", w.Code, w.Body)
				}
				if got != tc.want {
					t.Errorf("remaining after the settle = %d, want %d", got, tc.want)
				}
			})
		})
	}
}

// TestSettleHeadersDescribeReservation: the rate-limit headers of a
// settled response are those of the reservation, written before the body.
func TestSettleHeadersDescribeReservation(t *testing.T) {
	t.Parallel()
	lim := mustNew(t, memorystore.New(), []httplimit.Rule{tokenRule(&httplimit.Settle{Header: "X-Tokens-Used"})})
	w := do(lim.Handler(meteredHandler), "GET", "/?used=9", "192.0.2.1:1", nil)
	if got, want := remaining(t, w.Header(), "tokens"), int64(6); got != want {
		t.Errorf("RateLimit r = %d, want %d (10 less the estimate)", got, want)
	}
}

// TestSettleDebt: a response that cost more than the key had left puts the
// key in debt, which its next requests wait out.
func TestSettleDebt(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b testkit.Store) {
		c := newClock()
		lim := mustNew(t, b.New(t, c.Now), []httplimit.Rule{{
			Name:     "llm",
			Policies: []enforce.Policy{{Name: "tokens", Limit: tollgate.PerMinute(10)}},
			Cost:     func(*http.Request) int { return 1 },
			Settle:   &httplimit.Settle{Header: "X-Tokens-Used"},
		}})
		h := lim.Handler(meteredHandler)
		if w := do(h, "GET", "/?used=15", "192.0.2.1:1", nil); w.Code != 200 {
			t.Fatalf("first request: %d", w.Code)
		}
		if err := lim.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		// 10 − 15 = −5 tokens: one more is 6 tokens away, 36 s at 10 a
		// minute.
		for _, step := range []struct {
			advance time.Duration
			want    int
		}{
			{0, http.StatusTooManyRequests},
			{35 * time.Second, http.StatusTooManyRequests},
			{time.Second, http.StatusOK},
		} {
			c.Advance(step.advance)
			w := do(h, "GET", "/", "192.0.2.1:1", nil)
			if w.Code != step.want {
				t.Fatalf("after %v more: %d (Retry-After %q), want %d", step.advance, w.Code, w.Header().Get("Retry-After"), step.want)
			}
		}
	})
}

// TestSettleBadValues: values that are not one whole number of 0 to
// 2^53 − 1 are never trusted: the estimate stands, and they are counted and
// logged without the value.
func TestSettleBadValues(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, query string
		value       string // must not be logged
	}{
		{"not a number", "used=lots", "lots"},
		{"negative", "used=-3", "-3"},
		{"a sign", "used=%2B3", "+3"},
		{"a fraction", "used=2.5", "2.5"},
		{"huge", "used=99999999999999999999", "99999999999999999999"},
		{"2^53", "used=9007199254740992", "9007199254740992"},
		{"several values", "used=1&used=2", "1"},
		{"a list in one value", "used=1,2", "1,2"},
		{"empty", "used=", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewRegistry()
			logs := &testkit.Logs{}
			lim := mustNew(t, memorystore.New(), []httplimit.Rule{tokenRule(&httplimit.Settle{Header: "X-Tokens-Used"})},
				enforce.WithRegistry(reg), enforce.WithLogger(slog.New(logs)))
			h := lim.Handler(meteredHandler)
			w, got := settleThenLook(t, lim, h, "/?"+tc.query)
			if w.Code != 200 {
				t.Fatalf("response %d, want the handler's 200", w.Code)
			}
			if want := int64(6); got != want {
				t.Errorf("remaining after the settle = %d, want %d: the estimate", got, want)
			}
			if got := testutil.ToFloat64(gaugeFrom(t, reg, "tollgate_http_bad_costs_total", map[string]string{"rule": "llm"})); got != 1 {
				t.Errorf("bad_costs_total = %v, want 1", got)
			}
			recs := logs.Attrs()
			if len(recs) != 1 {
				t.Fatalf("%d log records, want 1: %v", len(recs), recs)
			}
			if recs[0]["rule"] != "llm" || !strings.Contains(recs[0]["error"], "X-Tokens-Used") {
				t.Errorf("log record = %v", recs[0])
			}
			if tc.value != "" {
				for k, v := range recs[0] {
					if strings.Contains(v, tc.value) {
						t.Errorf("log record's %s = %q holds the value %q", k, v, tc.value)
					}
				}
			}
		})
	}
}

// TestSettleFuncNegative: a Func's negative cost is a bad value too.
func TestSettleFuncNegative(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	lim := mustNew(t, memorystore.New(), []httplimit.Rule{tokenRule(&httplimit.Settle{
		Func: func(int, http.Header) (int, bool) { return -1, true },
	})}, enforce.WithRegistry(reg), enforce.WithLogger(slog.New(&testkit.Logs{})))
	if _, got := settleThenLook(t, lim, lim.Handler(meteredHandler), "/"); got != 6 {
		t.Errorf("remaining after the settle = %d, want 6: the estimate", got)
	}
	// Both requests, the first and the look after it, reported -1.
	if got := testutil.ToFloat64(gaugeFrom(t, reg, "tollgate_http_bad_costs_total", map[string]string{"rule": "llm"})); got != 2 {
		t.Errorf("bad_costs_total = %v, want 2", got)
	}
}

// TestSettleHide: with Hide the metering header never reaches the client,
// as a header or as a trailer, and the other headers and trailers do;
// without it, it does. Over a real connection, where trailers are sent.
func TestSettleHide(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, query       string
		hide              bool
		header, trailer   string // X-Tokens-Used as the client sees it
		announced, others bool
	}{
		{"header shown", "used=3", false, "3", "", false, false},
		{"header hidden", "used=3", true, "", "", false, false},
		{"trailer shown", "trailer&used=3", false, "", "3", true, false},
		{"trailer hidden", "trailer&used=3", true, "", "", false, false},
		{"unannounced trailer shown", "late&used=3", false, "", "3", false, false},
		{"unannounced trailer hidden", "late&used=3", true, "", "", false, false},
		{"other trailers stay", "trailer&used=3&other", true, "", "", false, true},
		{"early hints shown", "hints&used=3", false, "3", "", false, false},
		{"early hints hidden", "hints&used=3", true, "", "", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lim := mustNew(t, memorystore.New(), []httplimit.Rule{tokenRule(&httplimit.Settle{Header: "X-Tokens-Used", Hide: tc.hide})})
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Query().Has("other") {
					w.Header().Add("Trailer", "X-Checksum")
					defer func() { w.Header().Set("X-Checksum", "abc") }()
				}
				if r.URL.Query().Has("hints") {
					w.Header().Set("X-Tokens-Used", "3")
					w.Header().Set("Link", "</style.css>; rel=preload")
					w.WriteHeader(http.StatusEarlyHints)
				}
				meteredHandler(w, r)
			})
			var hints []textproto.MIMEHeader
			trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
				hints = append(hints, h)
				return nil
			}}
			srv := httptest.NewServer(lim.Handler(handler))
			defer srv.Close()
			req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", srv.URL+"/?"+tc.query, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range hints {
				if got, want := h.Get("X-Tokens-Used"), tc.header; got != want {
					t.Errorf("103 Early Hints X-Tokens-Used = %q, want %q", got, want)
				}
				if h.Get("Link") == "" {
					t.Errorf("103 Early Hints lost its Link: %v", h)
				}
			}
			if got, want := len(hints) > 0, strings.Contains(tc.query, "hints"); got != want {
				t.Errorf("got early hints: %v, want %v", got, want)
			}
			// The client moves the Trailer header's names into Trailer.
			_, announced := resp.Trailer["X-Tokens-Used"]
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(body) != "generated" {
				t.Fatalf("body %q", body)
			}
			if got := resp.Header.Get("X-Tokens-Used"); got != tc.header {
				t.Errorf("header X-Tokens-Used = %q, want %q", got, tc.header)
			}
			if got := resp.Trailer.Get("X-Tokens-Used"); got != tc.trailer {
				t.Errorf("trailer X-Tokens-Used = %q, want %q", got, tc.trailer)
			}
			if got := announced; got != tc.announced {
				t.Errorf("X-Tokens-Used announced as a trailer: %v, want %v", got, tc.announced)
			}
			if got := resp.Trailer.Get("X-Checksum") == "abc"; got != tc.others {
				t.Errorf("trailer X-Checksum = %q; want it: %v", resp.Trailer.Get("X-Checksum"), tc.others)
			}
			if err := lim.Drain(context.Background()); err != nil {
				t.Fatal(err)
			}
			// Hidden or not, the limiter read it: 10 − 3.
			next := do(lim.Handler(handler), "GET", "/", "127.0.0.1:1", nil)
			if got, want := remaining(t, next.Header(), "tokens"), int64(10-3-4); got != want {
				t.Errorf("remaining after the settle = %d, want %d", got, want)
			}
		})
	}
}

// TestSettleFlusher: a streaming handler still finds an http.Flusher, and
// what it flushes reaches the client before the handler returns.
func TestSettleFlusher(t *testing.T) {
	t.Parallel()
	lim := mustNew(t, memorystore.New(), []httplimit.Rule{tokenRule(&httplimit.Settle{Header: "X-Tokens-Used"})})
	release := make(chan struct{})
	srv := httptest.NewServer(lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := w.(http.Flusher)
		if !ok {
			http.Error(w, "no flusher", 500)
			return
		}
		_, _ = io.WriteString(w, "first\n")
		f.Flush()
		<-release
		_, _ = io.WriteString(w, "second\n")
	})))
	defer srv.Close()
	defer close(release)
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, len("first\n"))
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "first\n" {
		t.Fatalf("first flushed chunk %q, %v", buf, err)
	}
}

// TestSettleRejectedRefunds: a request another rule turns away was not
// served: what the settling rule reserved for it is given back.
func TestSettleRejectedRefunds(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b testkit.Store) {
		lim := mustNew(t, b.New(t, newClock().Now), []httplimit.Rule{
			tokenRule(&httplimit.Settle{Header: "X-Tokens-Used"}),
			{
				Name:     "strict",
				Match:    func(r *http.Request) bool { return r.Header.Get("X-Strict") != "" },
				Policies: []enforce.Policy{{Name: "strict", Limit: tollgate.PerMinute(1)}},
			},
		})
		h := lim.Handler(meteredHandler)
		strict := http.Header{"X-Strict": {"1"}}
		if w := do(h, "GET", "/?used=4", "192.0.2.1:1", strict); w.Code != 200 {
			t.Fatalf("first: %d", w.Code)
		}
		if w := do(h, "GET", "/?used=4", "192.0.2.1:1", strict); w.Code != http.StatusTooManyRequests {
			t.Fatalf("second: %d, want 429 from the strict rule", w.Code)
		}
		if err := lim.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		w := do(h, "GET", "/", "192.0.2.1:1", nil)
		if got, want := remaining(t, w.Header(), "tokens"), int64(10-4-4); got != want {
			t.Errorf("remaining = %d, want %d: the rejected request's 4 refunded", got, want)
		}
	})
}

// TestSettleDryRun: a dry-run rule that settles counts the real cost too,
// and never blocks.
func TestSettleDryRun(t *testing.T) {
	t.Parallel()
	rule := tokenRule(&httplimit.Settle{Header: "X-Tokens-Used"})
	rule.DryRun = true
	lim := mustNew(t, memorystore.New(), []httplimit.Rule{rule})
	h := lim.Handler(meteredHandler)
	if w := do(h, "GET", "/?used=9", "192.0.2.1:1", nil); w.Code != 200 {
		t.Fatalf("first: %d", w.Code)
	}
	if err := lim.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	// 10 − 9 = 1 token: the estimate of 4 would be denied, in dry run.
	w := do(h, "GET", "/", "192.0.2.1:1", nil)
	if w.Code != 200 {
		t.Errorf("dry run blocked: %d", w.Code)
	}
	if got, want := remaining(t, w.Header(), "tokens"), int64(1); got != want {
		t.Errorf("remaining = %d, want %d", got, want)
	}
}

// TestSettleNeedsSettler: a rule that settles on a store that cannot is
// refused at New, as are Settles that say nothing or too much.
func TestSettleNeedsSettler(t *testing.T) {
	t.Parallel()
	type plainStore struct{ tollgate.Store } // hides the Settler methods
	for _, tc := range []struct {
		name   string
		store  tollgate.Store
		settle *httplimit.Settle
		want   string
	}{
		{"not a Settler", plainStore{memorystore.New()}, &httplimit.Settle{Header: "X-Tokens-Used"}, "cannot settle"},
		{"empty", memorystore.New(), &httplimit.Settle{}, "needs a Header, a Func or a Refund"},
		{"header and func", memorystore.New(), &httplimit.Settle{Header: "X-Tokens-Used", Func: func(int, http.Header) (int, bool) { return 0, false }}, "not both"},
		{"hide without header", memorystore.New(), &httplimit.Settle{Refund: httplimit.ServerError, Hide: true}, "Hide"},
		{"bad header name", memorystore.New(), &httplimit.Settle{Header: "X Tokens"}, "not a header name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := httplimit.New(tc.store, []httplimit.Rule{tokenRule(tc.settle)})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "httplimit: ") {
				t.Errorf("New: %v, want an httplimit error saying %q", err, tc.want)
			}
		})
	}
}

// TestSettleStoreFails: Redis stops, or hangs, after the reservation and
// before the settle: the response is the handler's, whole, and the failed
// settle is counted in store_errors_total and logged; the estimate stands.
func TestSettleStoreFails(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		fail func(*redistest.Server) error
	}{
		{"stopped", (*redistest.Server).Stop},
		{"paused", (*redistest.Server).Pause},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.NewServer(t)
			t.Cleanup(func() { _ = srv.Resume() })
			reg := prometheus.NewRegistry()
			logs := &testkit.Logs{}
			lim := mustNew(t, redisstore.New(srv.Client(t)), []httplimit.Rule{tokenRule(&httplimit.Settle{Header: "X-Tokens-Used"})},
				enforce.WithTimeout(3*time.Second), enforce.WithRegistry(reg), enforce.WithLogger(slog.New(logs)))
			h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if err := tc.fail(srv); err != nil {
					t.Error(err)
				}
				w.Header().Set("X-Tokens-Used", "1")
				_, _ = io.WriteString(w, "generated")
			}))
			w := do(h, "GET", "/", "192.0.2.1:1", nil)
			if w.Code != 200 || w.Body.String() != "generated" {
				t.Errorf("response %d %q, want the handler's 200", w.Code, w.Body)
			}
			if got, want := remaining(t, w.Header(), "tokens"), int64(6); got != want {
				t.Errorf("RateLimit r = %d, want %d", got, want)
			}
			if tc.name == "paused" {
				// The settle waits for the paused Redis until its deadline,
				// seconds away: the response did not wait for it.
				done, cancel := context.WithCancel(context.Background())
				cancel()
				if err := lim.Drain(done); err == nil {
					t.Error("the settle was over when the response returned: the response waited for it")
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := lim.Drain(ctx); err != nil {
				t.Fatalf("the settle did not give up: %v", err)
			}
			if got := testutil.ToFloat64(gaugeFrom(t, reg, "tollgate_http_store_errors_total", map[string]string{"rule": "llm"})); got != 1 {
				t.Errorf("store_errors_total = %v, want 1", got)
			}
			recs := logs.Attrs()
			if len(recs) != 1 || recs[0]["outcome"] != "estimate_stands" || recs[0]["policy"] != "tokens" {
				t.Errorf("log records = %v, want one with outcome estimate_stands", recs)
			}
		})
	}
}

// TestSettleReaderFrom: a body the handler copies in (io.Copy,
// http.ServeContent) reaches the writer underneath through its own
// ReadFrom — net/http's sends a file with sendfile — and the response is
// metered as a written one: its hidden header kept from the client and
// its cost settled.
func TestSettleReaderFrom(t *testing.T) {
	t.Parallel()
	lim := mustNew(t, memorystore.New(), []httplimit.Rule{tokenRule(&httplimit.Settle{Header: "X-Tokens-Used", Hide: true})})
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Tokens-Used", "1")
		// A LimitedReader has no WriteTo: io.Copy asks w for ReadFrom.
		_, _ = io.Copy(w, io.LimitReader(strings.NewReader("the body"), 100))
	}))
	rec := httptest.NewRecorder()
	w := &readerFrom{ResponseWriter: rec}
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "192.0.2.1:1"
	h.ServeHTTP(w, r)
	if err := lim.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, want := w.calls, 1; got != want {
		t.Errorf("ReadFrom of the writer underneath called %d times, want %d", got, want)
	}
	if got, want := rec.Body.String(), "the body"; got != want {
		t.Errorf("body %q, want %q", got, want)
	}
	if got := rec.Header().Get("X-Tokens-Used"); got != "" {
		t.Errorf("hidden header reached the client: %q", got)
	}
	next := do(h, "GET", "/", "192.0.2.1:1", nil)
	if got, want := remaining(t, next.Header(), "tokens")+4, int64(9); got != want {
		t.Errorf("remaining after the settle = %d, want %d", got, want)
	}
}

// readerFrom is a ResponseWriter with a ReadFrom of its own, counted.
type readerFrom struct {
	http.ResponseWriter
	calls int
}

func (w *readerFrom) ReadFrom(r io.Reader) (int64, error) {
	w.calls++
	return io.Copy(struct{ io.Writer }{w.ResponseWriter}, r)
}

// TestSettleCalendarRefused: a rule that settles refuses a policy of
// calendar windows, which cannot be settled, when it is made.
func TestSettleCalendarRefused(t *testing.T) {
	t.Parallel()
	r := tokenRule(&httplimit.Settle{Header: "X-Tokens-Used"})
	r.Policies = []enforce.Policy{{Name: "monthly", Limit: tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 100_000, Calendar: tollgate.Calendar{Unit: "month", Zone: "UTC"}}}}
	_, err := httplimit.New(memorystore.New(), []httplimit.Rule{r})
	if want := `httplimit: rule "llm" settles its cost after the response, but policy "monthly" counts in calendar windows, which cannot be settled`; err == nil || err.Error() != want {
		t.Errorf("New: %v, want %q", err, want)
	}
}
