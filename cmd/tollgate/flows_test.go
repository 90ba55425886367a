package main

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
)

// The two calls Envoy's rate limit filter makes for one request, as the
// route configuration of docs/service.md builds them: the request's start
// (descriptors of the ordinary rate limits) and its stream's end (those
// marked apply_on_stream_done, with tollgate.phase=stream_done and a
// hits_addend taken from the response).

// withHitsAddend sets a descriptor's own hits_addend, as a route's
// hits_addend (number or format) does.
func withHitsAddend(d *rlv3.RateLimitDescriptor, n uint64) *rlv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// streamDone is the stream-done descriptor of a route whose start
// descriptor is pairs: the same entries and the phase marker.
func streamDone(hits uint64, pairs ...string) *rlv3.RateLimitDescriptor {
	return withHitsAddend(desc(append(pairs, service.PhaseKey, service.PhaseStreamDone)...), hits)
}

// TestServeStreamDone runs Envoy's two-call flow against tollgate serve
// over gRPC, on memory and on Redis: a request admitted at its start, the
// rest of its cost charged when its stream is done, past what is left, and
// the next request over the limit.
func TestServeStreamDone(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), `domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: token_bucket}
  - key: team
    rate_limit: {unit: minute, requests_per_unit: 1000, algorithm: fixed_window}
`)
	stores(t, func(t *testing.T, storeArgs []string) {
		p := startTollgate(t, "serve", append([]string{"--config", dir}, storeArgs...)...)
		code := func(r *pb.RateLimitRequest) string { return p.ask(r).OverallCode.String() }

		// A request of hits 1 (Envoy's default) starts; its response
		// reports 150 tokens, charged at the end although 99 are left.
		if got, want := code(request("llm", desc("tenant", "a"))), "OK"; got != want {
			t.Fatalf("start: %s, want %s", got, want)
		}
		done := p.ask(request("llm", streamDone(150, "tenant", "a")))
		if got, want := done.OverallCode.String(), "OK"; got != want {
			t.Errorf("stream done: %s, want %s (Envoy ignores it; a charge answers OK)", got, want)
		}
		if got, want := done.Statuses[0].GetLimitRemaining(), uint32(0); got != want {
			t.Errorf("stream done: limit_remaining %d, want %d", got, want)
		}
		next := p.ask(request("llm", desc("tenant", "a")))
		if got, want := next.OverallCode.String(), "OVER_LIMIT"; got != want {
			t.Fatalf("next start: %s, want %s", got, want)
		}

		// An estimate at the start, the rest at the end; per descriptor,
		// one route's two rate limits (a tenant's and a team's budget).
		start := request("llm", withHitsAddend(desc("tenant", "b"), 20), withHitsAddend(desc("team", "b"), 20))
		if got, want := codesOf(p.ask(start)), "OK: OK OK"; got != want {
			t.Fatalf("start with an estimate: %s, want %s", got, want)
		}
		p.ask(request("llm", streamDone(80, "tenant", "b"), streamDone(5, "team", "b")))
		if got, want := codesOf(p.ask(request("llm", desc("tenant", "b"), desc("team", "b")))), "OVER_LIMIT: OVER_LIMIT OK"; got != want {
			t.Errorf("after the charges: %s, want %s (the tenant's 100 spent, the team's 25 of 1000)", got, want)
		}

		// Far past the capacity and past --max-hits: charged, bounded by
		// a debt of one capacity, which the next token waits out: 101
		// tokens at 100 a minute.
		p.ask(request("llm", streamDone(1_000_000, "tenant", "c")))
		over := p.ask(request("llm", desc("tenant", "c")))
		if got, want := over.OverallCode.String(), "OVER_LIMIT"; got != want {
			t.Fatalf("after a charge of 1,000,000: %s, want %s", got, want)
		}
		// 60.6 s, rounded up; 60 when the machine stalled for 0.6 s.
		if got := over.Statuses[0].GetDurationUntilReset().GetSeconds(); got < 60 || got > 61 {
			t.Errorf("after a charge of 1,000,000: duration_until_reset %ds, want 61 s (a debt of 100 and one token, at 100 a minute, rounded up)", got)
		}
		if got, want := p.metric(`tollgate_serve_decisions_total{domain="llm",outcome="charged",rule="llm.tenant"}`), 3.0; got != want {
			t.Errorf("charges counted %v, want %v", got, want)
		}
		if got, want := p.metric(`tollgate_serve_requests_total{api="grpc",code="invalid"}`), 0.0; got != want {
			t.Errorf("invalid requests %v, want %v", got, want)
		}
	})
}

// TestServeConcurrencyAcrossReplicas: two tollgate serve processes on one
// redis-server; requests take a slot through one and release it through
// the other, named by their x-request-id, and never more than
// max_in_flight are in flight. A release that never comes is made good by
// the lease.
func TestServeConcurrencyAcrossReplicas(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), `domain: llm
descriptors:
  - key: tenant
    concurrency: {max_in_flight: 3, lease: 1m, failure_mode: closed}
  - key: lost
    concurrency: {max_in_flight: 1, lease: 2s, failure_mode: closed}
`)
	rdb := redistest.NewServer(t)
	args := []string{"--config", dir, "--redis", rdb.URL(), "--redis-prefix", testkit.KeyPrefix(t), "--timeout", "5s", "--debug", "127.0.0.1:0"}
	a := startTollgate(t, "serve", args...)
	b := startTollgate(t, "serve", args...)

	const max, requests, workers = 3, 60, 8
	var (
		inFlight, peak, admitted atomic.Int64
		wg                       sync.WaitGroup
		next                     atomic.Int64
		errs                     = make(chan error, requests)
	)
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > requests {
					return
				}
				id := fmt.Sprintf("req-%d-%s", i, randomID())
				resp, err := a.rls.ShouldRateLimit(t.Context(), request("llm", desc("tenant", "acme", service.PermitKey, id)))
				if err != nil {
					errs <- err
					return
				}
				if resp.OverallCode == pb.RateLimitResponse_OK {
					admitted.Add(1)
					n := inFlight.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					time.Sleep(2 * time.Millisecond) // the request's work
					inFlight.Add(-1)
				}
				// Envoy makes the stream-done call for a denied request too.
				if _, err := b.rls.ShouldRateLimit(t.Context(), request("llm", desc("tenant", "acme", service.PhaseKey, service.PhaseStreamDone, service.PermitKey, id))); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	t.Logf("%d of %d requests admitted, at most %d in flight (max_in_flight %d)", admitted.Load(), requests, peak.Load(), max)
	if got := peak.Load(); got < 1 || got > max {
		t.Errorf("peak in flight %d, want 1 to %d", got, max)
	}
	if got := admitted.Load(); got < max {
		t.Errorf("%d of %d requests admitted, want at least %d", got, requests, max)
	}
	// Every slot was released through the other replica: all max are free.
	for i := range max {
		if got, want := codesOf(a.ask(request("llm", desc("tenant", "acme", service.PermitKey, fmt.Sprintf("after-%d", i))))), "OK: OK"; got != want {
			t.Fatalf("after the run, slot %d: %s, want %s", i, got, want)
		}
	}
	if got, want := codesOf(b.ask(request("llm", desc("tenant", "acme", service.PermitKey, "one-too-many")))), "OVER_LIMIT: OVER_LIMIT"; got != want {
		t.Fatalf("after the run, one more: %s, want %s", got, want)
	}

	// A request whose release is lost: its slot comes back when its lease
	// ends, and not before the other replica has seen it taken.
	if got, want := codesOf(a.ask(request("llm", desc("lost", "x", service.PermitKey, "crashed")))), "OK: OK"; got != want {
		t.Fatalf("lost: first start %s, want %s", got, want)
	}
	taken := time.Now()
	resp := b.ask(request("llm", desc("lost", "x", service.PermitKey, "waiting")))
	if got, want := codesOf(resp), "OVER_LIMIT: OVER_LIMIT"; got != want {
		t.Fatalf("lost: second start %s, want %s", got, want)
	}
	if got := resp.Statuses[0].GetDurationUntilReset().GetSeconds(); got < 1 || got > 2 {
		t.Errorf("lost: duration_until_reset %ds, want 1 to 2 s (until the lease ends)", got)
	}
	for {
		resp := b.ask(request("llm", desc("lost", "x", service.PermitKey, "waiting")))
		if resp.OverallCode == pb.RateLimitResponse_OK {
			break
		}
		if time.Since(taken) > 30*time.Second {
			t.Fatalf("lost: the slot did not come back within 30 s of a 2 s lease")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if waited := time.Since(taken); waited < time.Second {
		t.Errorf("lost: the slot came back after %v, before its 2 s lease could end", waited)
	}

	// The rules in force show the concurrency rules.
	addr := a.log.waitFor(t, debugListening, 10*time.Second)[1]
	res, err := http.Get("http://" + addr + "/rlconfig")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	want := "llm.lost: concurrency max_in_flight=1 lease=2s, shadow_mode: false, quota_mode: false\n" +
		"llm.tenant: concurrency max_in_flight=3 lease=1m0s, shadow_mode: false, quota_mode: false\n"
	if got := string(body); got != want {
		t.Errorf("/rlconfig:\n%s\nwant:\n%s", got, want)
	}
	if got, want := a.metric(`tollgate_serve_decisions_total{domain="llm",outcome="fail_closed",rule="llm.tenant"}`), 0.0; got != want {
		t.Errorf("fail_closed answers %v, want %v", got, want)
	}
	if got := b.metric(`tollgate_serve_decisions_total{domain="llm",outcome="released",rule="llm.tenant"}`); got != requests {
		t.Errorf("releases counted on the other replica %v, want %d", got, requests)
	}
}

// TestServeConcurrencyMemory: the same flow on one process's memory store.
func TestServeConcurrencyMemory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), "domain: llm\ndescriptors:\n  - key: tenant\n    concurrency: {max_in_flight: 1, lease: 1m}\n")
	p := startTollgate(t, "serve", "--config", dir)
	for i, step := range []struct {
		descs []string
		want  string
	}{
		{[]string{"tenant", "acme", service.PermitKey, "a"}, "OK: OK"},
		{[]string{"tenant", "acme", service.PermitKey, "b"}, "OVER_LIMIT: OVER_LIMIT"},
		{[]string{"tenant", "acme", service.PhaseKey, service.PhaseStreamDone, service.PermitKey, "a"}, "OK: OK"},
		{[]string{"tenant", "acme", service.PermitKey, "b"}, "OK: OK"},
	} {
		if got := codesOf(p.ask(request("llm", desc(step.descs...)))); got != step.want {
			t.Fatalf("step %d (%s): %s, want %s", i, strings.Join(step.descs, " "), got, step.want)
		}
	}
}
