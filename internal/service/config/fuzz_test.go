package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/service/config"
)

// FuzzLoad feeds the rules loader arbitrary files. Whatever the input, it
// must return either rules or an error (never both, never neither), within
// the default limits, without panicking, each warning with its place; the seed corpus in
// testdata/fuzz/FuzzLoad holds the envoy fixtures and hostile files such as
// alias bombs. Run it with memory capped, so that a file that makes the
// loader allocate without bound fails the run instead of the machine:
//
//	GOMEMLIMIT=512MiB sh -c 'ulimit -v 4000000; go test -run XXX -fuzz FuzzLoad -fuzztime 3m ./config/'
func FuzzLoad(f *testing.F) {
	limits := config.DefaultLimits()
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := config.Parse("fuzz.yaml", data, config.WithWarnings(func(w config.Warning) {
			if w.File != "fuzz.yaml" || w.Line < 1 || w.Column < 1 || w.Msg == "" {
				t.Fatalf("a warning without a place or a message: %+v", w)
			}
		}))
		if err != nil {
			if r != nil {
				t.Fatalf("Parse returned rules with its error %v", err)
			}
			if !strings.HasPrefix(err.Error(), "config: ") {
				t.Fatalf("error %q does not start with the package name", err)
			}
			var le *config.LoadError
			if errors.As(err, &le) && len(le.Errors) == 0 {
				t.Fatalf("a LoadError with no errors")
			}
			return
		}
		if r == nil {
			t.Fatal("Parse returned neither rules nor an error")
		}
		if got := len(r.All()); got > limits.MaxDescriptors {
			t.Fatalf("%d rules, more than the %d descriptors allowed", got, limits.MaxDescriptors)
		}
		for i, rule := range r.All() {
			if rule.Index != i {
				t.Fatalf("rule %s has Index %d at position %d", rule.ID, rule.Index, i)
			}
			if !r.HasDomain(rule.Domain) {
				t.Fatalf("rule %s of an unknown domain %q", rule.ID, rule.Domain)
			}
			if len(rule.ID) > (limits.MaxValueLen*2+2)*(limits.MaxDepth+1) {
				t.Fatalf("rule ID of %d bytes", len(rule.ID))
			}
		}
		again, err := config.Parse("fuzz.yaml", data)
		if err != nil || !r.Same(again) || len(again.All()) != len(r.All()) {
			t.Fatalf("a second Parse of the same file differs: %v", err)
		}
	})
}
