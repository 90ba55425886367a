package service

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
)

// metadataRules give each kind of rule metadata: two that pass (one over
// its limit after the first hit), a shadow-mode rule over its limit, a
// quota rule over it, an unlimited rule, and one that another replaces.
const metadataRules = `domain: d
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 10}
    metadata: {name: a, route: {cluster: one, weight: 1}}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 10, name: b, replaces: [{name: r}]}
    metadata: {name: b, other: x, route: {cluster: two, zone: z}}
  - key: once
    rate_limit: {unit: hour, requests_per_unit: 1}
    metadata: {once: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 0}
    metadata: {shadow: true}
  - key: quota
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 0}
    metadata: {quota: true}
  - key: free
    rate_limit: {unlimited: true}
    metadata: {free: true}
  - key: gone
    rate_limit: {unit: hour, requests_per_unit: 10, name: r}
    metadata: {gone: true}
`

// TestRuleMetadata: with WithResponseMetadata, the dynamic metadata holds
// under "metadata" the rules' metadata of the descriptors answered OK, in
// the request's order, as envoyproxy/ratelimit returns it: a key the
// first has is kept, mappings under one key are merged, a descriptor over
// its limit (a quota rule's included), an unlimited rule or a replaced one
// adds nothing; a shadow-mode rule's denial is answered OK and adds its
// own. The rules' metadata is shared, never changed by a merge.
func TestRuleMetadata(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, metadataRules, WithResponseMetadata(true))
	for i, tc := range []struct {
		keys []string
		want string // the "metadata" field, "" for none
	}{
		{[]string{"a"}, `{"name":"a","route":{"cluster":"one","weight":1}}`},
		{[]string{"a", "b"}, `{"name":"a","other":"x","route":{"cluster":"one","weight":1,"zone":"z"}}`},
		{[]string{"b", "a"}, `{"name":"b","other":"x","route":{"cluster":"two","weight":1,"zone":"z"}}`},
		{[]string{"once", "a"}, `{"name":"a","once":true,"route":{"cluster":"one","weight":1}}`},
		{[]string{"once", "a"}, `{"name":"a","route":{"cluster":"one","weight":1}}`}, // once is over its limit now
		{[]string{"shadow", "quota", "free"}, `{"shadow":true}`},
		{[]string{"gone", "b"}, `{"name":"b","other":"x","route":{"cluster":"two","zone":"z"}}`},
		{[]string{"nothing"}, ""},
		{[]string{"a"}, `{"name":"a","route":{"cluster":"one","weight":1}}`}, // unchanged by the merges
	} {
		r := req("d")
		for _, k := range tc.keys {
			r.Descriptors = append(r.Descriptors, req("d", entries(k, "v")).Descriptors...)
		}
		md := ask(t, s, r).GetDynamicMetadata()
		if md.GetFields()["domain"].GetStringValue() != "d" {
			t.Fatalf("%d: no dynamic metadata of the request: %v", i, md)
		}
		got := ""
		if m := md.GetFields()["metadata"]; m != nil {
			b, err := protojson.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			got = strings.ReplaceAll(string(b), " ", "")
		}
		if got != tc.want {
			t.Errorf("%d %v: metadata %s, want %s", i, tc.keys, got, tc.want)
		}
	}
	if md := ask(t, newTestServer(t, metadataRules), req("d", entries("a", "v"))).GetDynamicMetadata(); md != nil {
		t.Errorf("metadata without WithResponseMetadata: %v", md)
	}
}
