package config_test

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/service/config"
)

// TestParseSources reads rules given as named contents, as a directory
// of files is read, and wants every bound of Load applied to them: the
// size of one, their total, their number, and each file's own bounds.
func TestParseSources(t *testing.T) {
	t.Parallel()
	a := config.Source{Name: "default/eg/http", Data: []byte("domain: default/eg/http\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")}
	b := config.Source{Name: "second", Data: []byte("domain: second\n")}
	nested := config.Source{Name: "nested", Data: []byte("domain: nested\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n")}
	r, err := config.ParseSources([]config.Source{a, b, nested})
	if err != nil {
		t.Fatalf("ParseSources: %v", err)
	}
	if got, want := strings.Join(r.DomainNames(), ","), "default/eg/http,nested,second"; got != want {
		t.Errorf("domains = %s, want %s", got, want)
	}
	if rule := config.Lookup(r, "default/eg/http", kvs("k", "v")); rule == nil || rule.RequestsPerUnit != 1 {
		t.Errorf("Lookup(default/eg/http, k=v) = %v, want the rule of 1/second", rule)
	}
	if again, _ := config.ParseSources([]config.Source{a, b, nested}); !again.Same(r) {
		t.Error("the same sources parsed twice are not Same")
	}
	if none, err := config.ParseSources(nil); err != nil || none.Domains() != 0 {
		t.Errorf("ParseSources(nil) = %v domains, %v; want no domain and no error", none.Domains(), err)
	}

	tests := []struct {
		name    string
		sources []config.Source
		limits  config.Limits
		want    string
	}{
		{"file size", []config.Source{a}, config.Limits{MaxFileSize: 20}, `config: default/eg/http: larger than the limit of 20 bytes`},
		{"total size", []config.Source{a, b}, config.Limits{MaxTotalSize: 110}, `config: second: the sources add up to more than the limit of 110 bytes`},
		{"count", []config.Source{a, b}, config.Limits{MaxFiles: 1}, `config: 2 sources, more than the limit of 1`},
		{"depth", []config.Source{nested}, config.Limits{MaxDepth: 1}, `config: nested:5:7: descriptors nested deeper than 1 levels`},
		{"descriptors", []config.Source{a, nested}, config.Limits{MaxDescriptors: 2}, `config: nested:5:9: more than the limit of 2 descriptors`},
		{"value length", []config.Source{a}, config.Limits{MaxValueLen: 5}, `config: default/eg/http:1:9: 15 bytes, more than the limit of 5`},
		{"same name twice", []config.Source{a, a}, config.Limits{}, `config: default/eg/http: a second source of this name`},
		{"no name", []config.Source{{Data: b.Data}}, config.Limits{}, `config: a source without a name`},
		{"domain twice", []config.Source{a, {Name: "other", Data: a.Data}}, config.Limits{}, `domain "default/eg/http" is already defined at default/eg/http:1`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := config.ParseSources(tc.sources, config.WithLimits(tc.limits))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseSources = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
