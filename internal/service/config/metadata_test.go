package config_test

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tollgate/tollgate/internal/service/config"
)

// TestMetadata reads descriptors' metadata as envoyproxy/ratelimit does:
// any mapping, its scalars by their YAML type, aliases expanded; nothing
// for a descriptor without it, or with an empty one.
func TestMetadata(t *testing.T) {
	t.Parallel()
	r, err := config.Parse("m.yaml", []byte(`domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
    metadata: &m
      name: service_1
      tier: {level: 2, ratio: 0.5, on: true, off: null, since: 2026-01-02}
      tags: [x, 7]
  - key: b
    rate_limit: {unit: second, requests_per_unit: 1}
    metadata: *m
  - key: c
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: e
    rate_limit: {unit: second, requests_per_unit: 1}
    metadata: {}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"name":"service_1","tags":["x",7],"tier":{"level":2,"off":null,"on":true,"ratio":0.5,"since":"2026-01-02"}}`
	for _, tc := range []struct{ key, want string }{{"a", want}, {"b", want}, {"c", ""}, {"e", ""}} {
		rule := config.Lookup(r, "d", kvs(tc.key, "v"))
		got := ""
		if rule.Metadata != nil {
			b, err := protojson.MarshalOptions{}.Marshal(rule.Metadata)
			if err != nil {
				t.Fatal(err)
			}
			got = strings.ReplaceAll(string(b), " ", "") // protojson's spacing varies on purpose
		}
		if got != tc.want {
			t.Errorf("%s: metadata %s, want %s", tc.key, got, tc.want)
		}
	}
}

// TestMetadataRefused: metadata that is no mapping, repeats a key, or
// nests deeper than the bound of descriptors (16 levels) is refused with
// its line.
func TestMetadataRefused(t *testing.T) {
	t.Parallel()
	deep := strings.Repeat("{a: ", 17) + "1" + strings.Repeat("}", 17)
	for _, tc := range []struct{ name, metadata, want string }{
		{"a scalar", "name", `m.yaml:5:15: metadata must be a mapping, found "name"`},
		{"a list", "[a, b]", `m.yaml:5:15: metadata must be a mapping, found a list`},
		{"a repeated key", "{a: 1, a: 2}", `metadata key "a" repeated`},
		{"17 levels", deep, `m.yaml:5:79: metadata nested deeper than 16 levels (the limit)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse("m.yaml", []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    metadata: "+tc.metadata+"\n"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %s", err, tc.want)
			}
		})
	}
	// 16 levels are fine.
	ok := strings.Repeat("{a: ", 16) + "1" + strings.Repeat("}", 16)
	if _, err := config.Parse("m.yaml", []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    metadata: "+ok+"\n")); err != nil {
		t.Errorf("16 levels of metadata: %v", err)
	}
}
