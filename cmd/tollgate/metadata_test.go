package main

import (
	"net/http"
	"strings"
	"testing"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/internal/test/xdstest"
)

// TestServeRuleMetadata: with RESPONSE_DYNAMIC_METADATA=true, the rules'
// metadata comes back in the dynamic metadata, under "metadata", merged
// over the descriptors answered OK, as envoyproxy/ratelimit returns it:
// of rules pushed over xDS (in field 8 of the descriptor, as later
// schemas than tollgate's write it), over gRPC; of rules from files, over
// /json.
func TestServeRuleMetadata(t *testing.T) {
	t.Parallel()
	t.Run("xDS", func(t *testing.T) {
		t.Parallel()
		mgmt := xdstest.Start(t, nil)
		p := spawnEnv(t, []string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + mgmt.Addr, "CONFIG_GRPC_XDS_NODE_ID=" + egNode,
			"FORCE_START_WITHOUT_INITIAL_CONFIG=true", "RESPONSE_DYNAMIC_METADATA=true", "USE_STATSD=false",
			"HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0"})
		p.awaitListening(grpc.WithTransportCredentials(insecure.NewCredentials()))
		d := egDomain("default/eg/http", rlsconf.RateLimitUnit_HOUR, 1)
		inner := d.Descriptors[0].Descriptors[0]
		d.Descriptors[0].Descriptors[0] = withMetadata(t, inner, map[string]any{"service": "backend", "route": map[string]any{"weight": 2}})
		d.Descriptors[1] = withMetadata(t, d.Descriptors[1], map[string]any{"service": "probe", "route": map[string]any{"zone": "a"}, "probe": true})
		mgmt.Push(t, egNode, "1", d)
		testkit.Eventually(t, "the push in force", func() bool { return limitOf(p, "default/eg/http") == 1 })

		client := "c-" + randomID()
		both := request("default/eg/http", desc(egRoute, egRoute, "rule-0-match-0", client), desc(egProbe, client))
		for i, want := range []string{
			`{"probe":true,"route":{"weight":2,"zone":"a"},"service":"backend"}`, // both pass: merged, the first's service
			``, // both over their limit of 1 an hour
		} {
			resp := p.ask(both)
			if got := metadataOf(t, resp.GetDynamicMetadata()); got != want {
				t.Errorf("request %d: metadata %s, want %s", i+1, got, want)
			}
			if got := resp.GetDynamicMetadata().GetFields()["domain"].GetStringValue(); got != "default/eg/http" {
				t.Errorf("request %d: dynamic metadata's domain %q", i+1, got)
			}
		}
	})
	t.Run("files", func(t *testing.T) {
		t.Parallel()
		root := runtimeTree(t, "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5}\n    metadata: {plan: free, limits: [5, hour]}\n")
		p := startEnv(t, composeEnv("", root, "RESPONSE_DYNAMIC_METADATA=true"))
		code, body := postJSON(t, p.http+"/json", `{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"`+randomID()+`"}]}]}`)
		if code != http.StatusOK || !strings.Contains(strings.ReplaceAll(body, " ", ""), `"metadata":{"limits":[5,"hour"],"plan":"free"}`) {
			t.Errorf("/json: %d %s, want the rule's metadata in dynamicMetadata", code, body)
		}
	})
}

// withMetadata returns d with metadata m in field 8, as later versions of
// the schema than tollgate's write a descriptor's metadata.
func withMetadata(t *testing.T, d *rlsconf.RateLimitDescriptor, m map[string]any) *rlsconf.RateLimitDescriptor {
	t.Helper()
	st, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	mb, err := proto.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	b = protowire.AppendBytes(protowire.AppendTag(b, 8, protowire.BytesType), mb)
	var later rlsconf.RateLimitDescriptor
	if err := proto.Unmarshal(b, &later); err != nil {
		t.Fatal(err)
	}
	return &later
}

// metadataOf is the "metadata" field of dynamic metadata md, as compact
// JSON, "" when there is none.
func metadataOf(t *testing.T, md *structpb.Struct) string {
	t.Helper()
	m := md.GetFields()["metadata"]
	if m == nil {
		return ""
	}
	b, err := protojson.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(string(b), " ", "")
}
