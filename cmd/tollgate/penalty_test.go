package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestServePenalty runs a penalty through the binary on the real clock,
// on memory and Redis: 2 a second, and the third denial within a minute
// keeps the tenant out for 3 s, past the second in which the limit
// refills; the answer that starts it says so in duration_until_reset, and
// another tenant is not held up.
func TestServePenalty(t *testing.T) {
	t.Parallel()
	tollgateBinary(t)
	stores(t, func(t *testing.T, storeArgs []string) {
		path := filepath.Join(t.TempDir(), "rules.yaml")
		rules := "domain: login\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: second\n      requests_per_unit: 2\n      penalty: {for: 3s, after: 3, within: 1m}\n"
		if err := os.WriteFile(path, []byte(rules), 0o644); err != nil {
			t.Fatal(err)
		}
		p := startTollgate(t, "serve", append([]string{"--config", path}, storeArgs...)...)
		// The five requests must fall in one second of the per-second
		// window: they start just after a second begins, and a run held
		// up across the next one is made again by another user.
		var (
			user string
			got  []string
		)
		for try := 0; ; try++ {
			time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 10*time.Millisecond)))
			start := time.Now()
			user, got = "u-"+randomID(), nil
			for range 5 {
				got = append(got, codesOf(p.ask(request("login", desc("user", user)))))
			}
			if time.Now().Truncate(time.Second).Equal(start.Truncate(time.Second)) || try == 4 {
				break
			}
		}
		trippedAt := time.Now()
		tripped := p.ask(request("login", desc("user", user))) // during the penalty
		want := []string{"OK: OK", "OK: OK", "OVER_LIMIT: OVER_LIMIT", "OVER_LIMIT: OVER_LIMIT", "OVER_LIMIT: OVER_LIMIT"}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("answers %v, want %v", got, want)
			}
		}
		if d := tripped.Statuses[0].DurationUntilReset.AsDuration(); d <= 0 || d > 3*time.Second {
			t.Errorf("during the penalty: duration_until_reset %v, want the rest of 3s", d)
		}
		if got := p.metric(`tollgate_serve_penalties_total{domain="login",rule="login.user"}`); got != 1 {
			t.Errorf("penalties_total = %v, want 1", got)
		}
		time.Sleep(1200 * time.Millisecond) // the limit refills; the penalty runs on
		// (Unless the machine held the test up until the penalty was over.)
		if got := codesOf(p.ask(request("login", desc("user", user)))); got != "OVER_LIMIT: OVER_LIMIT" && time.Since(trippedAt) < 2500*time.Millisecond {
			t.Errorf("1.2 s into the penalty: %s, want OVER_LIMIT", got)
		}
		if got := codesOf(p.ask(request("login", desc("user", "other-"+user)))); got != "OK: OK" {
			t.Errorf("another user during the penalty: %s, want OK", got)
		}
		time.Sleep(2 * time.Second)
		if got := codesOf(p.ask(request("login", desc("user", user)))); got != "OK: OK" {
			t.Errorf("after the penalty: %s, want OK", got)
		}
	})
}
