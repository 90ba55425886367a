package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestServeRollout runs a rollout through the binary on the real clock:
// a daily quota of 10 tightened to 5 from two seconds ahead, tried in
// shadow until then. Before the instant the answers announce it; from it,
// the tenant's 7 spent requests are over the new limit, on memory and on
// Redis.
func TestServeRollout(t *testing.T) {
	t.Parallel()
	tollgateBinary(t) // built before the clock starts
	stores(t, func(t *testing.T, storeArgs []string) {
		// The seven requests must come before the instant: on a machine
		// too busy for that within the margin, again with a wider one.
		for margin := 3 * time.Second; ; margin *= 2 {
			if rolloutAcrossTheSwitch(t, storeArgs, margin) || margin > 20*time.Second {
				return
			}
			t.Logf("the instant came before the requests were done; again with %v", 2*margin)
		}
	})
}

// rolloutAcrossTheSwitch is TestServeRollout with the instant margin
// ahead; false when the requests before it were not done in time.
func rolloutAcrossTheSwitch(t *testing.T, storeArgs []string, margin time.Duration) bool {
	from := time.Now().Truncate(time.Second).Add(margin)
	rules := fmt.Sprintf(`domain: api
descriptors:
  - key: tenant
    rate_limit:
      unit: day
      requests_per_unit: 10
      rollout: {requests_per_unit: 5, percent: 100, from: %s, shadow: true}
`, from.UTC().Format(time.RFC3339))
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startTollgate(t, "serve", append([]string{"--config", path}, storeArgs...)...)
	defer p.stop()
	tenant := "t-" + randomID()
	var resp *pb.RateLimitResponse
	for range 7 {
		resp = p.ask(request("api", desc("tenant", tenant)))
	}
	policy := ""
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == "RateLimit-Policy" {
			policy = h.Value
		}
	}
	shadowOver := p.metric(`tollgate_serve_rollout_decisions_total{arm="shadow",domain="api",outcome="over_limit",rule="api.tenant"}`)
	if !time.Now().Before(from) {
		return false
	}
	if resp.OverallCode != pb.RateLimitResponse_OK {
		t.Errorf("7th request before the rollout: %s, want OK (10 a day)", codesOf(resp))
	}
	if want := fmt.Sprintf(`"api.tenant";q=10;w=86400, "api.tenant:next";q=5;w=86400;tollgate-from=%d`, from.Unix()); policy != want {
		t.Errorf("before the rollout: RateLimit-Policy %q, want %q", policy, want)
	}
	if shadowOver != 2 {
		t.Errorf("shadow over_limit = %v, want 2 (7 tried against 5)", shadowOver)
	}

	time.Sleep(time.Until(from))
	resp = p.ask(request("api", desc("tenant", tenant)))
	if got, want := codesOf(resp), "OVER_LIMIT: OVER_LIMIT"; got != want {
		t.Errorf("from the instant: %s, want %s", got, want)
	}
	if got := resp.Statuses[0].CurrentLimit.GetRequestsPerUnit(); got != 5 {
		t.Errorf("from the instant: current_limit %d, want 5", got)
	}
	if got := p.metric(`tollgate_serve_rollout_decisions_total{arm="rolled",domain="api",outcome="over_limit",rule="api.tenant"}`); got != 1 {
		t.Errorf("rolled over_limit = %v, want 1", got)
	}
	return true
}
