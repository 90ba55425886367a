package service

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate/tollgate/internal/service/config"
	"github.com/tollgate/tollgate/memorystore"
)

const concRules = `
domain: llm
descriptors:
  - key: tenant
    concurrency: {max_in_flight: 2, lease: 1m}
  - key: batch
    shadow_mode: true
    concurrency: {max_in_flight: 1, lease: 1m}
`

// newConcServer is a server on memory stores whose clock the test moves.
func newConcServer(t *testing.T, rules string, opts ...Option) (*Server, *time.Time) {
	t.Helper()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	opts = append([]Option{WithClock(clock), WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		WithConcurrencyStore(memorystore.New(memorystore.WithClock(clock)))}, opts...)
	s, err := New(memorystore.New(memorystore.WithClock(clock)), opts...)
	if err != nil {
		t.Fatal(err)
	}
	r, err := config.Parse("rules.yaml", []byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	s.SetRules(r)
	return s, &now
}

// start and done are the two calls Envoy makes for a request with id.
func start(id string, pairs ...string) []*rlv3.RateLimitDescriptor {
	return []*rlv3.RateLimitDescriptor{d(-1, append(pairs, PermitKey, id)...)}
}

func done(id string, pairs ...string) []*rlv3.RateLimitDescriptor {
	return []*rlv3.RateLimitDescriptor{d(-1, append(pairs, PhaseKey, PhaseStreamDone, PermitKey, id)...)}
}

func TestConcurrencyFlow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		calls []call
	}{
		{"max in flight, a release frees a slot", []call{
			{"a starts", start("a", "tenant", "acme"), "OK"},
			{"b starts", start("b", "tenant", "acme"), "OK"},
			{"c: no slot", start("c", "tenant", "acme"), "OVER_LIMIT"},
			{"other tenant", start("x", "tenant", "beta"), "OK"},
			{"c's stream ends (denied, holds nothing)", done("c", "tenant", "acme"), "OK"},
			{"still full", start("d", "tenant", "acme"), "OVER_LIMIT"},
			{"a ends", done("a", "tenant", "acme"), "OK"},
			{"d gets a's slot", start("d", "tenant", "acme"), "OK"},
			{"full again", start("e", "tenant", "acme"), "OVER_LIMIT"},
		}},
		{"one name holds one slot", []call{
			{"a starts", start("a", "tenant", "acme"), "OK"},
			{"a again", start("a", "tenant", "acme"), "OVER_LIMIT"},
			{"b starts", start("b", "tenant", "acme"), "OK"},
		}},
		{"the phase entry may come first and say request", []call{
			{"a starts", []*rlv3.RateLimitDescriptor{d(-1, PhaseKey, PhaseRequest, "tenant", "acme", PermitKey, "a")}, "OK"},
			{"b starts", []*rlv3.RateLimitDescriptor{d(-1, PhaseKey, PhaseRequest, "tenant", "acme", PermitKey, "b")}, "OK"},
			{"a ends", []*rlv3.RateLimitDescriptor{d(-1, PhaseKey, PhaseStreamDone, "tenant", "acme", PermitKey, "a")}, "OK"},
			{"c starts", start("c", "tenant", "acme"), "OK"},
		}},
		{"without a name, a slot lasts its lease", []call{
			{"a starts", []*rlv3.RateLimitDescriptor{d(-1, "tenant", "acme")}, "OK"},
			{"b starts", []*rlv3.RateLimitDescriptor{d(-1, "tenant", "acme")}, "OK"},
			{"c: no slot", []*rlv3.RateLimitDescriptor{d(-1, "tenant", "acme")}, "OVER_LIMIT"},
		}},
		{"a look takes nothing", []call{
			{"look", []*rlv3.RateLimitDescriptor{d(0, "tenant", "acme", PermitKey, "a")}, "OK"},
			{"look", []*rlv3.RateLimitDescriptor{d(0, "tenant", "acme", PermitKey, "b")}, "OK"},
			{"look", []*rlv3.RateLimitDescriptor{d(0, "tenant", "acme", PermitKey, "c")}, "OK"},
			{"a starts", start("a", "tenant", "acme"), "OK"},
			{"b starts", start("b", "tenant", "acme"), "OK"},
		}},
		{"shadow mode never blocks", []call{
			{"a starts", start("a", "batch", "x"), "OK"},
			{"b: over, answered OK", start("b", "batch", "x"), "OK"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, _ := newConcServer(t, concRules)
			runFlow(t, s, tc.calls)
		})
	}
}

func TestConcurrencyLeaseEnds(t *testing.T) {
	t.Parallel()
	s, now := newConcServer(t, concRules)
	runFlow(t, s, []call{
		{"a starts", start("a", "tenant", "acme"), "OK"},
		{"b starts", start("b", "tenant", "acme"), "OK"},
	})
	resp := ask(t, s, &pb.RateLimitRequest{Domain: "llm", Descriptors: start("c", "tenant", "acme")})
	if got, want := codesOf(resp), "OVER_LIMIT: OVER_LIMIT"; got != want {
		t.Fatalf("c: %s, want %s", got, want)
	}
	if got, want := resp.Statuses[0].GetDurationUntilReset().GetSeconds(), int64(60); got != want {
		t.Errorf("c: duration_until_reset %ds, want %ds (until the first lease ends)", got, want)
	}
	if got, want := resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit(), uint32(2); got != want {
		t.Errorf("c: current_limit %d, want %d", got, want)
	}
	// a's and b's releases are lost; their leases end.
	*now = now.Add(time.Minute)
	runFlow(t, s, []call{
		{"c starts", start("c", "tenant", "acme"), "OK"},
		{"d starts", start("d", "tenant", "acme"), "OK"},
		{"e: no slot", start("e", "tenant", "acme"), "OVER_LIMIT"},
		{"a's late release frees nothing", done("a", "tenant", "acme"), "OK"},
		{"still full", start("e", "tenant", "acme"), "OVER_LIMIT"},
	})
	if got, want := testMetric(t, s, `tollgate_serve_decisions_total{domain="llm",outcome="released",rule="llm.tenant"}`), 1.0; got != want {
		t.Errorf("released %v, want %v", got, want)
	}
}

func TestFlowInvalid(t *testing.T) {
	t.Parallel()
	s, _ := newConcServer(t, concRules+"  - key: rate\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	for _, tc := range []struct {
		name string
		desc *rlv3.RateLimitDescriptor
		want string
	}{
		{"unknown phase", d(-1, "tenant", "acme", PhaseKey, "stream-done"), `tollgate.phase "stream-done": want request or stream_done`},
		{"release without a name", d(-1, "tenant", "acme", PhaseKey, PhaseStreamDone), "must name the request's permit (tollgate.permit)"},
	} {
		_, err := s.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "llm", Descriptors: []*rlv3.RateLimitDescriptor{tc.desc}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want InvalidArgument containing %q", tc.name, err, tc.want)
		}
	}
	if got, want := testMetric(t, s, `tollgate_serve_invalid_total{reason="phase"}`), 2.0; got != want {
		t.Errorf("invalid phase counted %v, want %v", got, want)
	}
	// A permit on a rate rule is ignored: the counter is the rule's.
	runFlow(t, s, []call{
		{"rate, named", []*rlv3.RateLimitDescriptor{d(-1, "rate", "r", PermitKey, "a")}, "OK"},
		{"rate, named otherwise", []*rlv3.RateLimitDescriptor{d(-1, "rate", "r", PermitKey, "b")}, "OVER_LIMIT"},
	})
}

// TestConcurrencyWithoutStore: a server given no concurrency store answers
// a concurrency rule by its failure mode.
func TestConcurrencyWithoutStore(t *testing.T) {
	t.Parallel()
	rules := strings.Replace(concRules, "{max_in_flight: 2, lease: 1m}", "{max_in_flight: 2, lease: 1m, failure_mode: closed}", 1)
	s := newTestServer(t, rules)
	runFlow(t, s, []call{{"a starts", start("a", "tenant", "acme"), "OVER_LIMIT"}})
	if got, want := testMetric(t, s, `tollgate_serve_decisions_total{domain="llm",outcome="fail_closed",rule="llm.tenant"}`), 1.0; got != want {
		t.Errorf("fail_closed %v, want %v", got, want)
	}
}

// testMetric returns the value of the series written as in the text
// format, name{label="value",...} with the labels sorted, or 0.
func testMetric(t *testing.T, s *Server, series string) float64 {
	t.Helper()
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+`="`+l.GetValue()+`"`)
			}
			name := mf.GetName()
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			if name == series {
				return m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

// TestConcurrencyFlowJSON: the same two calls over /json, as an HTTP client
// that is not Envoy makes them: a start takes a slot, a stream-done call
// gives it back.
func TestConcurrencyFlowJSON(t *testing.T) {
	t.Parallel()
	s, _ := newConcServer(t, concRules)
	h := s.Handler()
	post := func(id string, phase string) int {
		entries := `{"key":"tenant","value":"acme"},{"key":"` + PermitKey + `","value":"` + id + `"}`
		if phase != "" {
			entries += `,{"key":"` + PhaseKey + `","value":"` + phase + `"}`
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/json",
			strings.NewReader(`{"domain":"llm","descriptors":[{"entries":[`+entries+`]}]}`)))
		return w.Code
	}
	for i, step := range []struct {
		id, phase string
		want      int
	}{
		{"r1", "", 200},
		{"r2", "", 200},
		{"r3", "", 429}, // max_in_flight 2
		{"r1", PhaseStreamDone, 200},
		{"r3", "", 200}, // r1's slot is free again
		{"r4", "", 429},
	} {
		if got := post(step.id, step.phase); got != step.want {
			t.Fatalf("call %d (%s %s): %d, want %d", i, step.id, step.phase, got, step.want)
		}
	}
}
