package promtest_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/test/promtest"
)

// The rules and their tests, in deploy/prometheus.
var (
	rulesFile = filepath.Join("..", "..", "..", "deploy", "prometheus", "tollgate.rules.yml")
	rulesTest = filepath.Join("..", "..", "..", "deploy", "prometheus", "tollgate.rules.test.yml")
)

// promtool checks the rules (syntax, expressions, templates) and runs
// their unit tests: series as Prometheus would scrape them, and which
// alerts fire when.
func TestRules(t *testing.T) {
	t.Parallel()
	promtool := promtest.Binary(t, "promtool")
	for _, tc := range []struct {
		name string
		args []string
		want string // in the output
	}{
		{"check", []string{"check", "rules", rulesFile}, "SUCCESS: 16 rules found"},
		{"test", []string{"test", "rules", rulesTest}, "SUCCESS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := exec.Command(promtool, tc.args...).CombinedOutput()
			if err != nil || !strings.Contains(string(out), tc.want) {
				t.Errorf("promtool %s: %v, want %q in:\n%s", strings.Join(tc.args, " "), err, tc.want, out)
			}
		})
	}
}
