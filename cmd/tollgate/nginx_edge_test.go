package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/test/redistest"
)

// edgeConf is the shipped two-layer configuration and the edge limit it
// documents: rate requests a second per address, and burst.
type edgeConf struct {
	text        string
	rate, burst int
}

var (
	edgeRateRe  = regexp.MustCompile(`(?m)^\s*limit_req_zone \$binary_remote_addr zone=edge_per_address:\S+ rate=(\d+)r/s;`)
	edgeBurstRe = regexp.MustCompile(`(?m)^\s*limit_req zone=edge_per_address burst=(\d+) nodelay;`)
)

// readEdgeConf reads examples/nginx/edge.conf and the edge limit it sets,
// so the test's bounds follow the documented values.
func readEdgeConf(t *testing.T) edgeConf {
	t.Helper()
	b, err := os.ReadFile("../../examples/nginx/edge.conf")
	if err != nil {
		t.Fatal(err)
	}
	c := edgeConf{text: string(b)}
	r, bu := edgeRateRe.FindStringSubmatch(c.text), edgeBurstRe.FindStringSubmatch(c.text)
	if r == nil || bu == nil {
		t.Fatalf("examples/nginx/edge.conf: no limit_req_zone with rate=Nr/s (%v) or limit_req with burst=N nodelay (%v)", r != nil, bu != nil)
	}
	c.rate, _ = strconv.Atoi(r[1])
	c.burst, _ = strconv.Atoi(bu[1])
	return c
}

// countingApp is the API behind nginx: it says hello and counts the
// requests that reach it.
func countingApp(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var hits atomic.Int64
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("X-App", "yes")
		io.WriteString(w, "hello "+r.URL.Path)
	}))
	t.Cleanup(app.Close)
	return app, &hits
}

// Which layer answered a request through edge.conf.
const (
	byApp      = "app"      // passed both layers
	byEdge     = "edge"     // refused by nginx's limit_req, tollgate never asked
	byTollgate = "tollgate" // refused by tollgate's rules
)

// layer says which layer answered a, from what only that layer writes: the
// app's X-App header; tollgate's RateLimit field (nginx only copies it from
// tollgate's answer, so a 429 that carries it was decided by tollgate); the
// edge's problem detail and no RateLimit field. Anything else is described
// as it is, to fail the test.
func layer(a answer) string {
	var p struct {
		Status int
		Detail string
	}
	json.Unmarshal([]byte(a.body), &p)
	rl := a.header.Get("RateLimit")
	switch {
	case a.code == 200 && a.header.Get("X-App") == "yes":
		return byApp
	case a.code == 429 && p.Status == 429 && rl != "" && p.Detail == "rate limit exceeded":
		return byTollgate
	case a.code == 429 && p.Status == 429 && rl == "" && p.Detail == "too many requests from this address":
		return byEdge
	}
	return fmt.Sprintf("%d %q RateLimit=%q", a.code, a.body, rl)
}

// get is send for goroutines: it returns the error instead of failing.
func get(c *http.Client, url string) (answer, error) {
	resp, err := c.Get(url)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}, err
}

// authCalls is how many requests tollgate's auth endpoint answered, over
// every replica: every call counts once in tollgate_serve_requests_total,
// whatever its answer.
func authCalls(replicas ...*proc) int {
	n := 0.0
	for _, p := range replicas {
		for _, code := range []string{"ok", "over_limit", "invalid"} {
			n += p.metric(`tollgate_serve_requests_total{api="nginx",code="` + code + `"}`)
		}
	}
	return int(n)
}

// edgeKeyRules are the fine-grained rules behind the edge: 3 requests an
// hour per API key and path, whichever address they come from. A token
// bucket has no window edge for the test's requests to straddle, and at
// one token every 20 minutes none comes back during the test. The
// client address descriptor edge.conf also sends matches no rule here:
// the address is the edge's business in this test.
const edgeKeyRules = `domain: edge
descriptors:
  - key: api_key
    descriptors:
      - key: path
        rate_limit: {name: per_key_path, unit: hour, requests_per_unit: 3, algorithm: token_bucket}
`

// TestNginxEdge runs the shipped examples/nginx/edge.conf — only its
// addresses changed — with a real nginx in front of two replicas of
// tollgate serve that share one Redis, and checks that each layer does its
// part: nginx's per-address limit_req refuses a flood before tollgate is
// asked, and tollgate's per-key limit holds across client addresses and
// replicas.
//
// Clients are told apart by their real source addresses: Linux routes all
// of 127.0.0.0/8 to the loopback interface, so connections bound to
// 127.0.0.2, 127.0.0.3, … reach nginx from distinct $binary_remote_addr
// values, and tollgate sees the same address in X-Forwarded-For. No header
// the test sends picks an address.
func TestNginxEdge(t *testing.T) {
	t.Parallel()
	conf := readEdgeConf(t)
	app, hits := countingApp(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rules, edgeKeyRules)
	rdb := redistest.NewServer(t)
	// A loaded machine can take Redis past the 50 ms default deadline, and
	// the failure mode would then answer instead of the shared counter:
	// this test is about the layers, so the deadline is long.
	serve := []string{"serve", "--config", rules, "--redis", rdb.URL(), "--timeout", "5s"}
	tg1, tg2 := startTollgate(t, serve[0], serve[1:]...), startTollgate(t, serve[0], serve[1:]...)
	upstreams := "server " + strings.TrimPrefix(tg1.http, "http://") + ";\n        server " + strings.TrimPrefix(tg2.http, "http://") + ";"
	base := startNginxText(t, conf.text, "127.0.0.1:8088",
		[2]string{"server 127.0.0.1:8080;", upstreams},
		[2]string{"server 127.0.0.1:9000;", "server " + strings.TrimPrefix(app.URL, "http://") + ";"},
	)

	t.Run("flood from one address", func(t *testing.T) {
		// Several connections at once, kept alive, from one address: as
		// fast as this machine sends, usually far above the edge's rate.
		// The bounds below hold at any speed: a slow machine passes more.
		const workers = 8
		n := 4 * (conf.burst + 1)
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 5 * time.Second}
		tr := &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: workers}
		defer tr.CloseIdleConnections()
		c := &http.Client{Timeout: 10 * time.Second, Transport: tr}

		auth0, hits0 := authCalls(tg1, tg2), hits.Load()
		layers := make([]string, n)
		var next atomic.Int64
		var wg sync.WaitGroup
		var errOnce sync.Once
		var firstErr error
		start := time.Now()
		for range workers {
			wg.Go(func() {
				for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
					a, err := get(c, base+"/flood")
					if err != nil {
						errOnce.Do(func() { firstErr = err })
						return
					}
					layers[i] = layer(a)
				}
			})
		}
		wg.Wait()
		elapsed := time.Since(start)
		if firstErr != nil {
			t.Fatalf("flood: %v", firstErr)
		}
		count := map[string]int{}
		for _, l := range layers {
			count[l]++
		}
		passed, refused := count[byApp], count[byEdge]
		auth, reached := authCalls(tg1, tg2)-auth0, int(hits.Load()-hits0)
		t.Logf("flood of %d requests in %v: %d passed, %d refused by nginx; tollgate answered %d auth calls, the app %d requests",
			n, elapsed.Round(time.Millisecond), passed, refused, auth, reached)

		if got, want := passed+refused, n; got != want {
			t.Errorf("answers from the app or the edge = %d, want all %d: %v", got, want, count)
		}
		// Each request that passed the edge was asked about once, and no
		// refused one was: the subrequest comes after limit_req.
		if got, want := auth, passed; got != want {
			t.Errorf("tollgate auth calls = %d, want %d (the requests that passed the edge)", got, want)
		}
		if got, want := reached, passed; got != want {
			t.Errorf("requests reaching the app = %d, want %d", got, want)
		}
		// nodelay lets the first burst+1 through at once; a zone that also
		// counted the auth subrequests would refuse about half of them.
		if got, least := passed, conf.burst+1; got < least {
			t.Errorf("passed the edge = %d, want at least burst+1 = %d", got, least)
		}
		// Past the burst, the zone lets rate requests a second through:
		// at most burst + 1 + rate·t in all, t the time between the first
		// and the last request as nginx's clock sees it. The test measures
		// around the whole flood, so a slow machine only raises the bound;
		// nginx reads a coarse clock (one tick, a few milliseconds, behind
		// the precise one), for which clockSlack is added to t.
		const clockSlack = 50 * time.Millisecond
		most := conf.burst + 1 + int(math.Ceil(float64(conf.rate)*(elapsed+clockSlack).Seconds()))
		if got := passed; got > most {
			t.Errorf("passed the edge = %d, want at most burst + 1 + rate·(%v + %v) = %d", got, elapsed.Round(time.Millisecond), clockSlack, most)
		}

		// The zone keys on the address: another one still gets through.
		if got, want := layer(send(t, client("127.0.0.3"), base+"/flood")), byApp; got != want {
			t.Errorf("another address after the flood: answered by %s, want %s", got, want)
		}
	})

	t.Run("per key across addresses and replicas", func(t *testing.T) {
		overLimit := func() int {
			return int(tg1.metric(`tollgate_serve_requests_total{api="nginx",code="over_limit"}`) +
				tg2.metric(`tollgate_serve_requests_total{api="nginx",code="over_limit"}`))
		}
		over0, calls1, calls2 := overLimit(), authCalls(tg1), authCalls(tg2)
		b, c, d := client("127.0.0.4"), client("127.0.0.5"), client("127.0.0.6")
		steps := []struct {
			name      string
			client    *http.Client
			key       string
			layer     string
			remaining int // RateLimit's r for per_key_path
		}{
			{"B k1 1st", b, "k1", byApp, 2},
			{"C k1: the key's allowance, not C's own", c, "k1", byApp, 1},
			{"B k1 3rd", b, "k1", byApp, 0},
			{"C k1 over the key's limit", c, "k1", byTollgate, 0},
			{"D k2: another key", d, "k2", byApp, 2},
			{"B k1 over the key's limit", b, "k1", byTollgate, 0},
		}
		for _, s := range steps {
			got := send(t, s.client, base+"/export", "X-API-Key", s.key)
			if l := layer(got); l != s.layer {
				t.Errorf("%s: answered by %s, want %s", s.name, l, s.layer)
				continue
			}
			h := flat(got.header)
			if got, want := sfItems(t, h, "RateLimit-Policy"), `"per_key_path" q=3 w=3600`; got != want {
				t.Errorf("%s: RateLimit-Policy %s, want %s", s.name, got, want)
			}
			if got, want := sfItems(t, h, "RateLimit"), `"per_key_path" r=`+strconv.Itoa(s.remaining)+" t="; !strings.HasPrefix(got, want) {
				t.Errorf("%s: RateLimit %s, want it to start with %s", s.name, got, want)
			}
			if s.layer == byTollgate {
				if ra, err := strconv.Atoi(got.header.Get("Retry-After")); err != nil || ra < 1 || ra > 1200 {
					t.Errorf("%s: Retry-After %q, want 1 to 1200 (a token every 20 minutes)", s.name, got.header.Get("Retry-After"))
				}
			}
		}
		if got, want := overLimit()-over0, 2; got != want {
			t.Errorf("tollgate's over-limit answers = %d, want %d", got, want)
		}
		// nginx balances the auth calls round-robin: both replicas
		// decided, so the key's limit held across them through Redis.
		if got1, got2 := authCalls(tg1)-calls1, authCalls(tg2)-calls2; got1 == 0 || got2 == 0 {
			t.Errorf("auth calls answered by each replica = %d, %d; want both above 0", got1, got2)
		}
	})
}
