package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
	"github.com/tollgate/tollgate/retry"
)

var server *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &server) }

// fakeTime is a clock whose sleep advances it instead of waiting, and
// records every wait.
type fakeTime struct {
	*testkit.Clock
	mu     sync.Mutex
	waited []time.Duration
}

func newFakeTime() *fakeTime {
	return &fakeTime{Clock: testkit.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))}
}

func (f *fakeTime) Sleep(ctx context.Context, d time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.waited = append(f.waited, d)
	f.Advance(d)
	return ctx.Err()
}

// reply is one scripted response.
type reply struct {
	status int
	header map[string]string
}

// scripted is a real HTTP server answering with replies in order (the last
// one repeats), recording the bodies it received.
func scripted(t *testing.T, replies ...reply) (*httptest.Server, *[]string) {
	t.Helper()
	var mu sync.Mutex
	var bodies []string
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		rep := replies[min(n, len(replies)-1)]
		n++
		mu.Unlock()
		for k, v := range rep.header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(rep.status)
		fmt.Fprint(w, rep.status)
	}))
	t.Cleanup(srv.Close)
	return srv, &bodies
}

// maxRandom makes jitter always pick the top of its range.
func maxRandom(n int64) int64 { return n - 1 }

func TestWaits(t *testing.T) {
	t.Parallel()
	ft := newFakeTime()
	httpDate := ft.Now().Add(5 * time.Second).Format(http.TimeFormat)
	for _, tc := range []struct {
		name    string
		replies []reply
		opts    []retry.Option
		method  string
		want    []time.Duration
		status  int
	}{
		{"Retry-After seconds", []reply{{429, map[string]string{"Retry-After": "3"}}, {200, nil}}, nil, "GET", []time.Duration{3 * time.Second}, 200},
		{"Retry-After date", []reply{{503, map[string]string{"Retry-After": httpDate}}, {200, nil}}, nil, "GET", []time.Duration{5 * time.Second}, 200},
		{"RateLimit t of the exhausted policy", []reply{{429, map[string]string{"RateLimit": `"burst";r=5;t=1, "daily";r=0;t=7`}}, {200, nil}}, nil, "GET", []time.Duration{7 * time.Second}, 200},
		{"Retry-After wins over t", []reply{{429, map[string]string{"Retry-After": "2", "RateLimit": `"p";r=0;t=9`}}, {200, nil}}, nil, "GET", []time.Duration{2 * time.Second}, 200},
		{"malformed hints: backoff", []reply{{429, map[string]string{"Retry-After": "soon", "RateLimit": `p;r=zero`}}, {200, nil}}, nil, "GET", []time.Duration{100 * time.Millisecond}, 200},
		{"backoff doubles to its cap", []reply{{429, nil}}, []retry.Option{retry.WithMaxAttempts(6), retry.WithBackoff(100*time.Millisecond, 500*time.Millisecond)}, "GET",
			[]time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 500 * time.Millisecond, 500 * time.Millisecond}, 429},
		{"max attempts: the last response", []reply{{429, map[string]string{"Retry-After": "1"}}}, nil, "GET", []time.Duration{time.Second, time.Second, time.Second}, 429},
		{"hint past max elapsed: give up at once", []reply{{429, map[string]string{"Retry-After": "3600"}}}, nil, "GET", nil, 429},
		{"500 is not retried", []reply{{500, nil}}, nil, "GET", nil, 500},
		{"POST is not retried", []reply{{429, map[string]string{"Retry-After": "1"}}, {200, nil}}, nil, "POST", nil, 429},
		{"POST when told to", []reply{{429, map[string]string{"Retry-After": "1"}}, {200, nil}}, []retry.Option{retry.RetryNonIdempotent()}, "POST", []time.Duration{time.Second}, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ft := newFakeTime()
			srv, _ := scripted(t, tc.replies...)
			opts := append([]retry.Option{retry.WithClock(ft.Now), retry.WithSleep(ft.Sleep), retry.WithRandom(maxRandom)}, tc.opts...)
			client := &http.Client{Transport: retry.NewTransport(nil, opts...)}
			req, _ := http.NewRequest(tc.method, srv.URL, nil)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || string(body) != strconv.Itoa(tc.status) {
				t.Errorf("status %d body %q, want %d with its body", resp.StatusCode, body, tc.status)
			}
			if !reflect.DeepEqual(ft.waited, tc.want) {
				t.Errorf("waited %v, want %v", ft.waited, tc.want)
			}
		})
	}
}

// Full jitter: every wait is within [0, cap], and they differ.
func TestFullJitter(t *testing.T) {
	t.Parallel()
	ft := newFakeTime()
	srv, _ := scripted(t, reply{429, nil})
	rng := rand.New(rand.NewPCG(1, 2))
	tr := retry.NewTransport(nil, retry.WithClock(ft.Now), retry.WithSleep(ft.Sleep), retry.WithRandom(rng.Int64N),
		retry.WithMaxAttempts(40), retry.WithMaxElapsed(0), retry.WithBackoff(time.Second, 8*time.Second))
	resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(ft.waited) != 39 {
		t.Fatalf("%d waits, want 39", len(ft.waited))
	}
	seen := map[time.Duration]bool{}
	for i, d := range ft.waited {
		ceiling := 8 * time.Second
		if i < 3 {
			ceiling = time.Second << i
		}
		if d < 0 || d > ceiling {
			t.Errorf("wait %d = %v, outside [0, %v]", i+1, d, ceiling)
		}
		seen[d] = true
	}
	if len(seen) < 30 {
		t.Errorf("only %d distinct waits of 39: not jittered", len(seen))
	}
}

// A body is sent again on each attempt, when it can be; a body that cannot
// be replayed is sent once.
func TestBodies(t *testing.T) {
	t.Parallel()
	ft := newFakeTime()
	srv, bodies := scripted(t, reply{503, map[string]string{"Retry-After": "1"}}, reply{200, nil})
	client := &http.Client{Transport: retry.NewTransport(nil, retry.WithClock(ft.Now), retry.WithSleep(ft.Sleep))}

	req, _ := http.NewRequest("PUT", srv.URL, strings.NewReader("payload"))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !reflect.DeepEqual(*bodies, []string{"payload", "payload"}) {
		t.Errorf("status %d, bodies %q; want 200 and the payload twice", resp.StatusCode, *bodies)
	}

	srv2, bodies2 := scripted(t, reply{503, map[string]string{"Retry-After": "1"}}, reply{200, nil})
	req, _ = http.NewRequest("PUT", srv2.URL, io.NopCloser(strings.NewReader("stream"))) // no GetBody
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || len(*bodies2) != 1 {
		t.Errorf("unreplayable body: status %d after %d attempts, want 503 after 1", resp.StatusCode, len(*bodies2))
	}

	srv3, bodies3 := scripted(t, reply{429, map[string]string{"Retry-After": "1"}}, reply{201, nil})
	req, _ = http.NewRequest("POST", srv3.URL, strings.NewReader("order"))
	req.Header.Set("Idempotency-Key", "order-42")
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 || len(*bodies3) != 2 {
		t.Errorf("POST with Idempotency-Key: %d after %d attempts, want 201 after 2", resp.StatusCode, len(*bodies3))
	}
}

func TestContext(t *testing.T) {
	t.Parallel()
	// The deadline comes before the retry would: return the 429 at once
	// instead of waiting in vain.
	srv, bodies := scripted(t, reply{429, map[string]string{"Retry-After": "10"}}, reply{200, nil})
	ft := newFakeTime()
	client := &http.Client{Transport: retry.NewTransport(nil, retry.WithSleep(ft.Sleep))}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 429 || len(ft.waited) != 0 || len(*bodies) != 1 {
		t.Errorf("deadline before the retry: %d, waited %v, %d attempts; want the 429 at once", resp.StatusCode, ft.waited, len(*bodies))
	}

	// A context canceled during the wait ends the request with its error.
	srv2, _ := scripted(t, reply{429, map[string]string{"Retry-After": "10"}}, reply{200, nil})
	canceled, cancelNow := context.WithCancel(context.Background())
	defer cancelNow()
	sleepCancels := func(ctx context.Context, d time.Duration) error { cancelNow(); return ctx.Err() }
	req, _ = http.NewRequestWithContext(canceled, "GET", srv2.URL, nil)
	_, err = (&http.Client{Transport: retry.NewTransport(nil, retry.WithSleep(sleepCancels))}).Do(req)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("canceled during the wait: %v, want context.Canceled", err)
	}
}

func TestHintParsers(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"0", 0, true}, {"120", 2 * time.Minute, true}, {"-1", 0, false}, {"", 0, false}, {"1.5", 0, false},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"Sun, 06 Nov 1994 08:49:37 GMT", 0, true},
	} {
		got, ok := retry.RetryAfter(http.Header{"Retry-After": {tc.v}}, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("RetryAfter(%q) = %v, %v; want %v, %v", tc.v, got, ok, tc.want, tc.ok)
		}
	}
	for _, tc := range []struct {
		v    []string
		want time.Duration
		ok   bool
	}{
		{[]string{`"a";r=0;t=3`}, 3 * time.Second, true},
		{[]string{`"a";r=0;t=3, "b";r=0;t=8`}, 8 * time.Second, true},
		{[]string{`"a";r=0;t=3`, `"b";r=0;t=8`}, 8 * time.Second, true}, // split over lines
		{[]string{`"a";r=4;t=30`}, 0, false},                            // not exhausted
		{[]string{`"a";r=0`}, 0, false},                                 // no t
		{[]string{`"a";r=0;t=3,,`}, 0, false},                           // malformed: ignored
		{nil, 0, false},
	} {
		got, ok := retry.RateLimitReset(http.Header{"Ratelimit": tc.v})
		if got != tc.want || ok != tc.ok {
			t.Errorf("RateLimitReset(%q) = %v, %v; want %v, %v", tc.v, got, ok, tc.want, tc.ok)
		}
	}
}

// Three replicas, each with its own Limiter on one shared store, send 4
// requests each to a provider that allows 5 a minute: together exactly 5
// get through; the rest give up at their deadline without being sent.
func TestOutboundSharedQuota(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) func() tollgate.Store
	}{
		{"memory", func(t *testing.T) func() tollgate.Store {
			s := memorystore.New() // one process: replicas share it directly
			return func() tollgate.Store { return s }
		}},
		{"redis", func(t *testing.T) func() tollgate.Store {
			prefix := testkit.KeyPrefix(t)
			// Each replica has its own client and store, as separate pods.
			return func() tollgate.Store { return redisstore.New(server.Client(t), redisstore.WithPrefix(prefix)) }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var received atomic.Int64
			provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { received.Add(1) }))
			defer provider.Close()
			newStore := tc.store(t)
			var wg sync.WaitGroup
			var sent, refused atomic.Int64
			for replica := 0; replica < 3; replica++ {
				client := &http.Client{Transport: retry.NewOutbound(nil, tollgate.New(newStore()), "provider:acme", tollgate.PerMinute(5))}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 4; i++ {
						ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
						req, _ := http.NewRequestWithContext(ctx, "GET", provider.URL, nil)
						resp, err := client.Do(req)
						cancel()
						if err != nil {
							if !errors.Is(err, tollgate.ErrWaitExceedsDeadline) {
								t.Errorf("replica %d: %v, want ErrWaitExceedsDeadline", replica, err)
							}
							refused.Add(1)
							continue
						}
						resp.Body.Close()
						sent.Add(1)
					}
				}()
			}
			wg.Wait()
			if received.Load() != 5 || sent.Load() != 5 || refused.Load() != 7 {
				t.Errorf("provider received %d (sent %d, refused %d), want 5 of 12", received.Load(), sent.Load(), refused.Load())
			}
		})
	}
}
