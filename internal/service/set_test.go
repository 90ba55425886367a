package service

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/service/config"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
)

// setRules give plan=free 10 a second (a token bucket) and 15 a minute (a
// fixed window), together.
const setRules = `
domain: api
descriptors:
  - key: plan
    value: free
    rate_limits:
      - {unit: second, requests_per_unit: 10, algorithm: token_bucket}
      - {unit: minute, requests_per_unit: 15}
  - key: plan
    value: wide
    rate_limits:
      - {unit: second, requests_per_unit: 100, algorithm: token_bucket}
      - {unit: minute, requests_per_unit: 40}
`

// setStores are the stores a set is tested on: the memory store and real
// Redis, both on the test's clock.
var setStores = map[string]func(t *testing.T, clock func() time.Time) tollgate.Store{
	"memory": func(_ *testing.T, clock func() time.Time) tollgate.Store {
		return memorystore.New(memorystore.WithClock(clock))
	},
	"redis": func(t *testing.T, clock func() time.Time) tollgate.Store {
		return redisstore.New(redistest.NewServer(t).Client(t), redisstore.WithClock(clock))
	},
}

// testClock is a settable clock, safe for concurrent use.
type testClock struct{ now atomic.Pointer[time.Time] }

func newTestClock(t time.Time) *testClock {
	c := &testClock{}
	c.set(t)
	return c
}

func (c *testClock) set(t time.Time) { c.now.Store(&t) }
func (c *testClock) Now() time.Time  { return *c.now.Load() }

// newSetServer serves rules from store on clock.
func newSetServer(t *testing.T, store tollgate.Store, clock *testClock, rules string, opts ...Option) *Server {
	t.Helper()
	opts = append([]Option{WithClock(clock.Now), WithHeaders(headers.Draft), WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)
	s, err := New(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	r, err := config.Parse("rules.yaml", []byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	s.SetRules(r)
	return s
}

// limitText prints a status's current_limit, limit_remaining and
// duration_until_reset.
func limitText(st *pb.RateLimitResponse_DescriptorStatus) string {
	l := st.GetCurrentLimit()
	return fmt.Sprintf("%s %d/%s r=%d t=%ds", st.GetCode(), l.GetRequestsPerUnit(), l.GetUnit(), st.GetLimitRemaining(), st.GetDurationUntilReset().GetSeconds())
}

// setStats are envoy's statistics of one limit of plan=free.
func setStats(s *Server, step string) statsWant {
	v := func(i int) float64 {
		return testutil.ToFloat64(s.stats.vecs[i].WithLabelValues("api", "plan_free", step))
	}
	return statsWant{v(statTotalHits), v(statOverLimit), v(statNearLimit), v(statWithinLimit), v(statDryRun)}
}

// TestSetAllOrNothing sends 12 requests a second for four seconds to a
// plan of 10 a second and 15 a minute, on the memory store and on Redis:
// 15 pass in the minute, never more than 10 in one second, and a request
// one limit denies spends nothing of the other (the store's looks say
// what each has left). Each denial names the limit that decided it.
func TestSetAllOrNothing(t *testing.T) {
	t.Parallel()
	for name, newStore := range setStores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			start := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
			clock := newTestClock(start)
			store := newStore(t, clock.Now)
			s := newSetServer(t, store, clock, setRules)
			rule := config.Lookup(s.Rules(), "api", entries("plan", "free"))
			key := counterKey("api", entries("plan", "free"), rule)
			perSecond, perMinute := rule.SetLimits()[0], rule.SetLimits()[1]
			look := func(l tollgate.Limit) int {
				res, err := store.AllowN(context.Background(), key, l, 0)
				if err != nil {
					t.Fatal(err)
				}
				return res.Remaining
			}

			var admitted []int
			var lastDenied []string
			for sec := range 4 {
				clock.set(start.Add(time.Duration(sec) * time.Second))
				n, denied := 0, ""
				for range 12 {
					resp := ask(t, s, req("api", entries("plan", "free")))
					if resp.OverallCode == pb.RateLimitResponse_OK {
						n++
					} else {
						denied = limitText(resp.Statuses[0])
					}
				}
				admitted = append(admitted, n)
				lastDenied = append(lastDenied, denied)
				switch sec {
				case 0:
					// 10 spent of each; the 2 the second's bucket denied
					// spent nothing of the minute.
					if got, want := [2]int{look(perSecond), look(perMinute)}, [2]int{0, 5}; got != want {
						t.Errorf("after second 0: left (second, minute) %v, want %v", got, want)
					}
				case 1:
					// 5 more pass; the 7 the minute denied took no token.
					if got, want := [2]int{look(perSecond), look(perMinute)}, [2]int{5, 0}; got != want {
						t.Errorf("after second 1: left (second, minute) %v, want %v", got, want)
					}
				}
			}
			if got, want := admitted, []int{10, 5, 0, 0}; !reflect.DeepEqual(got, want) {
				t.Errorf("admitted per second %v, want %v", got, want)
			}
			want := []string{
				"OVER_LIMIT 10/SECOND r=0 t=1s",  // the bucket's next token, in 100 ms
				"OVER_LIMIT 15/MINUTE r=0 t=59s", // the minute's window, to 12:01:00
				"OVER_LIMIT 15/MINUTE r=0 t=58s",
				"OVER_LIMIT 15/MINUTE r=0 t=57s",
			}
			if !reflect.DeepEqual(lastDenied, want) {
				t.Errorf("denials:\n got %q\nwant %q", lastDenied, want)
			}

			// The next minute: the minute's window is new, the bucket full.
			clock.set(start.Add(time.Minute))
			resp := ask(t, s, req("api", entries("plan", "free")))
			if got, want := limitText(resp.Statuses[0]), "OK 10/SECOND r=9 t=1s"; got != want {
				t.Errorf("a minute later: %s, want %s (the limit with the least left)", got, want)
			}

			// Each limit counts its own: within_limit what it spent,
			// over_limit what it denied, and total_hits only the hits
			// the other limit denied.
			if got, want := setStats(s, "second"), (statsWant{total: 49, within: 16, over: 2, near: 2}); got != want {
				t.Errorf("per-second statistics %+v, want %+v", got, want)
			}
			if got, want := setStats(s, "minute"), (statsWant{total: 49, within: 16, over: 31, near: 3}); got != want {
				t.Errorf("per-minute statistics %+v, want %+v", got, want)
			}
			decisions := func(outcome string) float64 {
				return testutil.ToFloat64(s.m.decisions.WithLabelValues("api", "api.plan_free", outcome))
			}
			if ok, over := decisions("ok"), decisions("over_limit"); ok != 16 || over != 33 {
				t.Errorf("tollgate_serve_decisions_total ok %v over_limit %v, want 16 and 33", ok, over)
			}
		})
	}
}

// TestSetConcurrentRedis: 8 goroutines ask a plan of 100 a second and 40
// a minute on Redis at once, 20 requests each: exactly 40 pass.
func TestSetConcurrentRedis(t *testing.T) {
	t.Parallel()
	clock := newTestClock(time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC))
	s := newSetServer(t, setStores["redis"](t, clock.Now), clock, setRules)
	var ok atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				resp, err := s.ShouldRateLimit(context.Background(), req("api", entries("plan", "wide")))
				if err != nil {
					t.Error(err)
					return
				}
				if resp.OverallCode == pb.RateLimitResponse_OK {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := ok.Load(); got != 40 {
		t.Errorf("%d admitted, want exactly 40 (the minute's limit)", got)
	}
}

// sfList parses a structured-field list as a client would, each item as
// its String and its parameters in order.
func sfList(t *testing.T, field string, values []string) []string {
	t.Helper()
	if len(values) == 0 {
		t.Fatalf("%s missing", field)
	}
	list, err := httpsfv.UnmarshalList(values)
	if err != nil {
		t.Fatalf("%s: %q is not a structured-field list: %v", field, values, err)
	}
	var out []string
	for _, m := range list {
		it, ok := m.(httpsfv.Item)
		if !ok {
			t.Fatalf("%s: %#v is not an item", field, m)
		}
		s := fmt.Sprintf("%q", it.Value)
		for _, k := range it.Params.Names() {
			v, _ := it.Params.Get(k)
			s += fmt.Sprintf(" %s=%v", k, v)
		}
		out = append(out, s)
	}
	return out
}

// TestSetHeaders: RateLimit-Policy lists every limit of a set as a policy
// of its own, named after the limit (its name, or its statistics name);
// RateLimit carries the limit with the least room, beside the other
// descriptors' — over gRPC and over /json, with the descriptors decided in
// turn and at once.
func TestSetHeaders(t *testing.T) {
	t.Parallel()
	for _, parallel := range []bool{false, true} {
		t.Run(fmt.Sprintf("parallel descriptors %v", parallel), func(t *testing.T) {
			t.Parallel()
			testSetHeaders(t, WithParallelDescriptors(parallel))
		})
	}
}

func testSetHeaders(t *testing.T, opts ...Option) {
	const rules = `
domain: api
descriptors:
  - key: plan
    value: pro
    rate_limits:
      - {unit: second, requests_per_unit: 2, algorithm: token_bucket, burst: 3, name: burst}
      - {unit: day, requests_per_unit: 100}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 50}
`
	clock := newTestClock(time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC))
	s := newSetServer(t, memorystore.New(memorystore.WithClock(clock.Now)), clock, rules, opts...)
	field := func(resp *pb.RateLimitResponse, name string) []string {
		for _, h := range resp.ResponseHeadersToAdd {
			if strings.EqualFold(h.Key, name) {
				return []string{h.Value}
			}
		}
		return nil
	}
	two := req("api", entries("plan", "pro"), entries("ip", "10.0.0.1"))
	wantPolicy := []string{`"burst" q=2 w=1 tollgate-burst=3`, `"api.plan_pro.day" q=100 w=86400`, `"api.ip" q=50 w=60`}

	resp := ask(t, s, two)
	if got := sfList(t, "RateLimit-Policy", field(resp, "RateLimit-Policy")); !reflect.DeepEqual(got, wantPolicy) {
		t.Errorf("RateLimit-Policy:\n got %q\nwant %q", got, wantPolicy)
	}
	// 2 of the burst's 3 left, 99 of the day's: the burst has the least.
	if got, want := sfList(t, "RateLimit", field(resp, "RateLimit")), []string{`"burst" r=2 t=1`, `"api.ip" r=49 t=60`}; !reflect.DeepEqual(got, want) {
		t.Errorf("RateLimit:\n got %q\nwant %q", got, want)
	}
	ask(t, s, two)
	ask(t, s, two)
	resp = ask(t, s, two) // the burst is out: denied, 1 s to its next token
	if got, want := replyText(resp), "OVER_LIMIT [OVER_LIMIT r=0 t=1s] [OK r=46 t=60s]"; !strings.HasPrefix(got, want) {
		t.Errorf("denied: %s, want %s", got, want)
	}
	if got, want := sfList(t, "RateLimit", field(resp, "RateLimit")), []string{`"burst" r=0 t=1`, `"api.ip" r=46 t=60`}; !reflect.DeepEqual(got, want) {
		t.Errorf("RateLimit of a denial:\n got %q\nwant %q", got, want)
	}

	// /json: the same fields on the HTTP answer.
	clock.set(clock.Now().Add(time.Hour))
	rec := httptest.NewRecorder()
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"plan","value":"pro"}]}]}`
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(body)))
	if rec.Code != http.StatusOK {
		t.Fatalf("/json: %d %s", rec.Code, rec.Body)
	}
	if got := sfList(t, "RateLimit-Policy", rec.Header().Values("RateLimit-Policy")); !reflect.DeepEqual(got, wantPolicy[:2]) {
		t.Errorf("/json RateLimit-Policy:\n got %q\nwant %q", got, wantPolicy[:2])
	}
	if got, want := sfList(t, "RateLimit", rec.Header().Values("RateLimit")), []string{`"burst" r=2 t=1`}; !reflect.DeepEqual(got, want) {
		t.Errorf("/json RateLimit:\n got %q\nwant %q", got, want)
	}
	var out pb.RateLimitResponse
	if err := protojson.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if got, want := limitText(out.Statuses[0]), "OK 2/SECOND r=2 t=1s"; got != want || out.Statuses[0].CurrentLimit.Name != "burst" {
		t.Errorf("/json status %s (name %q), want %s (name burst)", got, out.Statuses[0].CurrentLimit.Name, want)
	}
}

// TestSetModes: a set's penalty, dry run, quota mode, look, replaces and
// stream-done charge, and envoy compatibility, each on a plan of 2 a
// second and 3 a minute (fixed windows) on the memory store.
func TestSetModes(t *testing.T) {
	t.Parallel()
	plan := func(descriptor, extra string) string {
		return `
domain: api
descriptors:
  - key: plan
` + descriptor + `
    rate_limits:
      - {unit: second, requests_per_unit: 2` + extra + `}
      - {unit: minute, requests_per_unit: 3}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 1, name: per_ip, replaces: [{name: per_minute}]}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: per_second}]}
`
	}
	start := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	plain := req("api", entries("plan", "free"))
	tests := []struct {
		name  string
		rules string
		opts  []Option
		// at each second from start, the requests sent, and the answers
		// wanted (replyText, without the header fields).
		steps []setStep
	}{
		{"penalty", plan("", ", penalty: {for: 10s}"), nil, []setStep{
			{0, plain, "OK [OK 2/SECOND r=1 t=1s]"},
			{0, plain, "OK [OK 2/SECOND r=0 t=1s]"},
			{0, plain, "OVER_LIMIT [OVER_LIMIT 2/SECOND r=0 t=10s]"}, // the second's denial starts the penalty
			{5, plain, "OVER_LIMIT [OVER_LIMIT 2/SECOND r=0 t=5s]"},  // the second is back, the penalty runs
			{10, plain, "OK [OK 3/MINUTE r=0 t=50s]"},
			{10, plain, "OVER_LIMIT [OVER_LIMIT 3/MINUTE r=0 t=50s]"}, // the minute's denial starts none
			{11, plain, "OVER_LIMIT [OVER_LIMIT 3/MINUTE r=0 t=49s]"},
		}},
		{"dry run", plan("    value: free\n    shadow_mode: true", ""), nil, []setStep{
			{0, plain, "OK [OK 2/SECOND r=1 t=1s]"},
			{0, plain, "OK [OK 2/SECOND r=0 t=1s]"},
			{0, plain, "OK [OK 2/SECOND r=0 t=1s]"}, // denied, in shadow
			{1, plain, "OK [OK 3/MINUTE r=0 t=59s]"},
			{1, plain, "OK [OK 3/MINUTE r=0 t=59s]"}, // denied, in shadow
		}},
		{"quota mode", plan("", ""), []Option{WithQuotaMode(true)}, []setStep{
			{0, plain, "OK [OK 2/SECOND r=1 t=1s]"},
			{0, plain, "OK [OK 2/SECOND r=0 t=1s]"},
			// One quota of two over: not over.
			{0, req("api", entries("plan", "free"), entries("ip", "10.0.0.1")), "OK [OVER_LIMIT 2/SECOND r=0 t=1s] [OK 1/SECOND r=0 t=1s]"},
		}},
		{"look", plan("", ""), nil, []setStep{
			{0, plain, "OK [OK 2/SECOND r=1 t=1s]"},
			{0, hits(plain, 0), "OK [OK 2/SECOND r=1 t=1s]"}, // spends nothing
			{0, plain, "OK [OK 2/SECOND r=0 t=1s]"},
			{0, hits(plain, 0), "OK [OK 2/SECOND r=0 t=1s]"}, // a look at what is left, as a rule of one limit's
			{0, plain, "OVER_LIMIT [OVER_LIMIT 2/SECOND r=0 t=1s]"},
		}},
		{"replaced by a limit's name", plan("", ", name: per_second"), nil, []setStep{
			{0, req("api", entries("plan", "free"), entries("user", "bob")), "OK [OK 0/UNKNOWN r=0 t=0s] [OK 1/SECOND r=0 t=1s]"},
			{0, req("api", entries("plan", "free"), entries("ip", "10.0.0.1")), "OK [OK 2/SECOND r=1 t=1s] [OK 1/SECOND r=0 t=1s]"},
		}},
		{"stream done", plan("", ""), nil, []setStep{
			{0, plain, "OK [OK 2/SECOND r=1 t=1s]"},
			{0, streamDoneOf(plain, 4), "OK [OK 3/MINUTE r=0 t=60s]"}, // charged to both: both out, the minute for longer
			{1, plain, "OVER_LIMIT [OVER_LIMIT 3/MINUTE r=0 t=59s]"},
		}},
		{"envoy compat", plan("", ""), []Option{WithEnvoyCompat(true)}, []setStep{
			{0, plain, "OK [OK 2/SECOND r=1 t=1s]"},
			{0, plain, "OK [OK 2/SECOND r=0 t=1s]"},
			{0, plain, "OVER_LIMIT [OVER_LIMIT 2/SECOND r=0 t=1s]"}, // spends nothing of the minute
			{1, plain, "OK [OK 3/MINUTE r=0 t=59s]"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := newTestClock(start)
			s := newSetServer(t, memorystore.New(memorystore.WithClock(clock.Now)), clock, tc.rules, append([]Option{WithHeaders(0)}, tc.opts...)...)
			for i, st := range tc.steps {
				clock.set(start.Add(time.Duration(st.sec) * time.Second))
				resp := ask(t, s, st.req)
				got := resp.OverallCode.String()
				for _, status := range resp.Statuses {
					got += " [" + limitText(status) + "]"
				}
				if got != st.want {
					t.Errorf("step %d (second %d): %s, want %s", i, st.sec, got, st.want)
				}
			}
		})
	}
}

// setStep is a request of TestSetModes at a second from its start, and the
// answer wanted.
type setStep struct {
	sec  int
	req  *pb.RateLimitRequest
	want string
}

// hits returns r with its first descriptor's hits_addend n.
func hits(r *pb.RateLimitRequest, n uint64) *pb.RateLimitRequest {
	c := proto.Clone(r).(*pb.RateLimitRequest)
	c.Descriptors[0].HitsAddend = wrapperspb.UInt64(n)
	return c
}

// streamDoneOf returns r as a stream-done call of n hits.
func streamDoneOf(r *pb.RateLimitRequest, n uint64) *pb.RateLimitRequest {
	c := hits(r, n)
	c.Descriptors[0].Entries = append(c.Descriptors[0].Entries, entries(PhaseKey, PhaseStreamDone)...)
	return c
}

// notCombiner is a store that cannot decide limits together.
type notCombiner struct{ tollgate.Store }

// TestSetNeedsACombiner: with a store that is no tollgate.Combiner, a set
// is answered by its failure mode, and counted as a store failure.
func TestSetNeedsACombiner(t *testing.T) {
	t.Parallel()
	clock := newTestClock(time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC))
	s := newSetServer(t, notCombiner{memorystore.New(memorystore.WithClock(clock.Now))}, clock, setRules, WithFailureMode(enforce.FailClosed))
	resp := ask(t, s, req("api", entries("plan", "free")))
	if got, want := limitText(resp.Statuses[0]), "OVER_LIMIT 10/SECOND r=0 t=1s"; got != want {
		t.Errorf("%s, want %s (fail closed, retry in a second)", got, want)
	}
	if got := testutil.ToFloat64(s.m.decisions.WithLabelValues("api", "api.plan_free", "fail_closed")); got != 1 {
		t.Errorf("fail_closed decisions %v, want 1", got)
	}
	if got := testutil.ToFloat64(s.m.storeErrors[storeError]); got != 1 {
		t.Errorf("store errors %v, want 1", got)
	}
}

// TestSetAdmin: the admin API looks at every limit of a set, and a reset
// gives every limit back.
func TestSetAdmin(t *testing.T) {
	t.Parallel()
	clock := newTestClock(time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC))
	s := newSetServer(t, memorystore.New(memorystore.WithClock(clock.Now)), clock, setRules)
	h, err := s.AdminHandler([]AdminToken{{Name: "test", Token: "0123456789abcdef"}})
	if err != nil {
		t.Fatal(err)
	}
	call := func(method, path string) string {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(method, path+"?domain=api&entry=plan=free", nil)
		r.Header.Set("Authorization", "Bearer 0123456789abcdef")
		h.ServeHTTP(rec, r)
		if rec.Code != http.StatusOK {
			t.Fatalf("%s %s: %d %s", method, path, rec.Code, rec.Body)
		}
		return strings.TrimSpace(rec.Body.String())
	}
	for range 3 {
		ask(t, s, req("api", entries("plan", "free")))
	}
	look := `{"domain":"api","keys":["plan"],"rule":"api.plan_free","kind":"rate","limits":[` +
		`{"name":"api.plan_free.second","limit":"10/s burst 10 token_bucket","remaining":7,"reset_in_seconds":0.3},` +
		`{"name":"api.plan_free.minute","limit":"15/m fixed_window","remaining":12,"reset_in_seconds":60}]}`
	if got := call(http.MethodGet, "/v1/counter"); got != look {
		t.Errorf("look:\n got %s\nwant %s", got, look)
	}
	call(http.MethodPost, "/v1/counter/reset")
	resp := ask(t, s, req("api", entries("plan", "free")))
	if got, want := limitText(resp.Statuses[0]), "OK 10/SECOND r=9 t=1s"; got != want {
		t.Errorf("after the reset: %s, want %s (both limits whole again)", got, want)
	}
}
