package xds

import (
	"fmt"
	"strings"
	"testing"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tollgate/tollgate/internal/service/config"
)

// egConfig is a domain as Envoy Gateway pushes it: the outer descriptor
// is key = value = the route's name, the inner one, rule-N-match-M, has
// no value and carries the limit.
func egConfig(domain string, unit rlsconf.RateLimitUnit, perUnit uint32) *rlsconf.RateLimitConfig {
	route := "httproute/default/api/rule/0"
	return &rlsconf.RateLimitConfig{Name: domain, Domain: domain, Descriptors: []*rlsconf.RateLimitDescriptor{{
		Key: route, Value: route,
		Descriptors: []*rlsconf.RateLimitDescriptor{{
			Key:       "rule-0-match-0",
			RateLimit: &rlsconf.RateLimitPolicy{Unit: unit, RequestsPerUnit: perUnit},
		}},
	}}}
}

func anys(t testing.TB, cs ...proto.Message) []*anypb.Any {
	t.Helper()
	out := make([]*anypb.Any, len(cs))
	for i, c := range cs {
		a, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = a
	}
	return out
}

func load(t testing.TB, limits config.Limits, cs ...proto.Message) (*config.Rules, error) {
	t.Helper()
	srcs, err := sources(anys(t, cs...), fileLimit(limits))
	if err != nil {
		return nil, err
	}
	return config.ParseSources(srcs, config.WithLimits(limits))
}

// TestRenderedResourcesLoad pushes resources through the loader of files
// and wants the rules they say, or the loader's refusal.
func TestRenderedResourcesLoad(t *testing.T) {
	t.Parallel()
	route := "httproute/default/api/rule/0"
	odd := "a \"quoted\" value,\n{with: [flow]} *alias &anchor ünïcødé \x01"
	tests := []struct {
		name    string
		configs []proto.Message
		lookup  [][2]string // entries of a request in domain "default/eg/http"
		want    string      // the rule found, or an error's text
	}{
		{"envoy gateway", []proto.Message{egConfig("default/eg/http", rlsconf.RateLimitUnit_MINUTE, 3)},
			[][2]string{{route, route}, {"rule-0-match-0", ""}}, "default/eg/http." + route + "_" + route + ".rule-0-match-0 3/minute"},
		{"every unit's number", []proto.Message{egConfig("default/eg/http", 7, 3)},
			[][2]string{{route, route}, {"rule-0-match-0", ""}}, "default/eg/http." + route + "_" + route + ".rule-0-match-0 3/week"},
		{"0 denies", []proto.Message{egConfig("default/eg/http", rlsconf.RateLimitUnit_SECOND, 0)},
			[][2]string{{route, route}, {"rule-0-match-0", "x"}}, "default/eg/http." + route + "_" + route + ".rule-0-match-0 0/second"},
		{"unit UNKNOWN", []proto.Message{egConfig("default/eg/http", rlsconf.RateLimitUnit_UNKNOWN, 3)},
			nil, `config: default/eg/http:3:50: invalid rate limit unit "UNKNOWN"`},
		{"a unit past the schema", []proto.Message{egConfig("default/eg/http", 9, 3)},
			nil, `invalid rate limit unit "9"`},
		{"unlimited", []proto.Message{&rlsconf.RateLimitConfig{Domain: "default/eg/http", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true, RequestsPerUnit: 5, Name: "free"}}}}},
			[][2]string{{"k", "v"}}, "default/eg/http.k unlimited name=free"},
		{"unlimited with a unit", []proto.Message{&rlsconf.RateLimitConfig{Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true, Unit: rlsconf.RateLimitUnit_SECOND}}}}},
			nil, "should not specify rate limit unit when unlimited"},
		{"values as they are", []proto.Message{&rlsconf.RateLimitConfig{Domain: "default/eg/http", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: odd, Value: odd, ShadowMode: true, DetailedMetric: true, RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: 1,
				Name: "n", Replaces: []*rlsconf.RateLimitReplace{{Name: "other"}}}}}}},
			[][2]string{{odd, odd}}, "default/eg/http." + odd + "_" + odd + " 1/hour name=n replaces=other dry-run detailed"},
		{"quota_mode of a later schema", []proto.Message{quotaConfig(t)},
			[][2]string{{"k", "v"}}, "default/eg/http.k 2/second quota"},
		{"metadata of a later schema", []proto.Message{metadataConfig(t, map[string]any{
			"name": "service_1", "route": map[string]any{"weight": 1.5, "on": true, "off": nil, "tags": []any{"a\"b", 7.0}}})},
			[][2]string{{"k", "v"}}, `default/eg/http.k 2/second metadata={"name":"service_1","route":{"off":null,"on":true,"tags":["a\"b",7],"weight":1.5}}`},
		{"metadata too deep", []proto.Message{metadataConfig(t, nested(17))}, nil, "metadata nested deeper than 16 levels (the limit)"},
		{"metadata unreadable", []proto.Message{badMetadataConfig(t)}, nil, `metadata must be a mapping, found "unreadable: no google.protobuf.Struct"`},
		{"empty key", []proto.Message{&rlsconf.RateLimitConfig{Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{{Value: "v"}}}},
			nil, "config: d:2:9: descriptor has no key"},
		{"no domain", []proto.Message{&rlsconf.RateLimitConfig{Name: "n"}}, nil, "config: n:1:12: domain is missing or empty"},
		{"a domain twice", []proto.Message{egConfig("a", 1, 1), &rlsconf.RateLimitConfig{Name: "b", Domain: "a"}},
			nil, `domain "a" is already defined at a:1`},
		{"not a RateLimitConfig", []proto.Message{&rlsconf.RateLimitPolicy{}}, nil, "xds: resource 0 is a type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitPolicy, not a RateLimitConfig"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := load(t, config.Limits{}, tc.configs...)
			if tc.lookup == nil {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("load = %v, want an error containing %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var es []config.KV
			for _, e := range tc.lookup {
				es = append(es, config.KV{Key: e[0], Value: e[1]})
			}
			if got := describe(config.Lookup(r, "default/eg/http", es)); got != tc.want {
				t.Errorf("rule\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

func describe(r *config.Rule) string {
	if r == nil {
		return "no rule"
	}
	s := r.ID
	if r.Unlimited {
		s += " unlimited"
	} else {
		s += fmt.Sprintf(" %d/%s", r.RequestsPerUnit, strings.ToLower(r.Unit.String()))
	}
	if r.Name != "" {
		s += " name=" + r.Name
	}
	if len(r.Replaces) > 0 {
		s += " replaces=" + strings.Join(r.Replaces, ",")
	}
	if r.DryRun {
		s += " dry-run"
	}
	if r.DetailedMetric {
		s += " detailed"
	}
	if r.QuotaMode {
		s += " quota"
	}
	if r.Metadata != nil {
		b, err := protojson.Marshal(r.Metadata)
		if err != nil {
			return err.Error()
		}
		s += " metadata=" + strings.ReplaceAll(string(b), " ", "")
	}
	return s
}

// metadataConfig is a domain whose descriptor has metadata m in field 8,
// as later versions of the schema write it.
func metadataConfig(t testing.TB, m map[string]any) *rlsconf.RateLimitConfig {
	t.Helper()
	st, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	mb, err := proto.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	d := &rlsconf.RateLimitDescriptor{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 2}}
	b, err := proto.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	b = protowire.AppendTag(b, 8, protowire.BytesType)
	b = protowire.AppendBytes(b, mb)
	var later rlsconf.RateLimitDescriptor
	if err := proto.Unmarshal(b, &later); err != nil {
		t.Fatal(err)
	}
	return &rlsconf.RateLimitConfig{Domain: "default/eg/http", Descriptors: []*rlsconf.RateLimitDescriptor{&later}}
}

// badMetadataConfig is a domain whose descriptor's field 8 is no Struct.
func badMetadataConfig(t testing.TB) *rlsconf.RateLimitConfig {
	t.Helper()
	d := &rlsconf.RateLimitDescriptor{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 2}}
	b, err := proto.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	b = protowire.AppendTag(b, 8, protowire.BytesType)
	b = protowire.AppendBytes(b, []byte{0xff, 0xff})
	var later rlsconf.RateLimitDescriptor
	if err := proto.Unmarshal(b, &later); err != nil {
		t.Fatal(err)
	}
	return &rlsconf.RateLimitConfig{Domain: "default/eg/http", Descriptors: []*rlsconf.RateLimitDescriptor{&later}}
}

// nested is metadata of levels mappings, one in the other.
func nested(levels int) map[string]any {
	m := map[string]any{"a": 1.0}
	for range levels - 1 {
		m = map[string]any{"a": m}
	}
	return m
}

// quotaConfig is a domain whose descriptor says quota_mode: true in field
// 7, as later versions of the schema write it.
func quotaConfig(t testing.TB) *rlsconf.RateLimitConfig {
	t.Helper()
	d := &rlsconf.RateLimitDescriptor{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 2}}
	b, err := proto.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	b = protowire.AppendTag(b, 7, protowire.VarintType)
	b = protowire.AppendVarint(b, 1)
	var later rlsconf.RateLimitDescriptor
	if err := proto.Unmarshal(b, &later); err != nil {
		t.Fatal(err)
	}
	return &rlsconf.RateLimitConfig{Domain: "default/eg/http", Descriptors: []*rlsconf.RateLimitDescriptor{&later}}
}

// TestHostileResources wants resources past the loader's bounds refused
// by them, at a cost bounded by the limit rather than by the resource.
func TestHostileResources(t *testing.T) {
	t.Parallel()
	nest := func(levels int) []*rlsconf.RateLimitDescriptor {
		d := &rlsconf.RateLimitDescriptor{Key: "k"}
		for range levels - 1 {
			d = &rlsconf.RateLimitDescriptor{Key: "k", Descriptors: []*rlsconf.RateLimitDescriptor{d}}
		}
		return []*rlsconf.RateLimitDescriptor{d}
	}
	wide := make([]*rlsconf.RateLimitDescriptor, 20)
	for i := range wide {
		wide[i] = &rlsconf.RateLimitDescriptor{Key: "k", Value: fmt.Sprint(i, strings.Repeat("v", 60<<10)), RateLimit: &rlsconf.RateLimitPolicy{Unit: 1, RequestsPerUnit: 1}}
	}
	many := make([]proto.Message, 300)
	for i := range many {
		many[i] = &rlsconf.RateLimitConfig{Domain: fmt.Sprint("d", i)}
	}
	tests := []struct {
		name    string
		configs []proto.Message
		want    string
	}{
		{"deep", []proto.Message{&rlsconf.RateLimitConfig{Domain: "d", Descriptors: nest(20)}},
			"config: d:17:29: descriptors nested deeper than 16 levels (the limit)"},
		// Past YAML's own bound of 10,000 levels (two a descriptor), the
		// parser refuses the file before it is read any further.
		{"deeper", []proto.Message{&rlsconf.RateLimitConfig{Domain: "d", Descriptors: nest(5001)}},
			"config: d: line 5001: exceeded max depth of 10000"},
		{"huge", []proto.Message{&rlsconf.RateLimitConfig{Domain: "d", Descriptors: wide}},
			"config: d: larger than the limit of 1048576 bytes"},
		{"many", many, "config: 300 sources, more than the limit of 256"},
		{"long value", []proto.Message{&rlsconf.RateLimitConfig{Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: strings.Repeat("k", 2000)}}}},
			"config: d:2:9: 2000 bytes, more than the limit of 1024"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := load(t, config.Limits{}, tc.configs...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("load = %.300v, want an error containing %q", err, tc.want)
			}
		})
	}
	if got := len(render(&rlsconf.RateLimitConfig{Domain: "d", Descriptors: wide}, 1000)); got > 1100 {
		t.Errorf("rendering stopped at %d bytes for a limit of 1000", got)
	}
}
