package httplimit_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/httplimit"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
)

// server is a real redis-server shared by the tests that do not stop it;
// each test writes under a prefix of its own instead of flushing.
var server *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &server) }

// newClock returns the clock of a scenario, shared by the store and the
// test.
func newClock() *testkit.Clock { return testkit.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)) }

// eachBackend runs f at the memory store and at Redis, in parallel.
func eachBackend(t *testing.T, f func(t *testing.T, b testkit.Store)) {
	t.Helper()
	testkit.EachStore(t, server.Client, f)
}

// mustNew makes a Limiter whose store deadline is generous — a first call
// to a fresh Redis client dials and loads a script, which on a loaded CI
// machine can take longer than the 50 ms default — unless opts set one: the
// tests about deadlines do.
func mustNew(t *testing.T, store tollgate.Store, rules []httplimit.Rule, opts ...enforce.Option) *httplimit.Limiter {
	t.Helper()
	opts = append([]enforce.Option{enforce.WithTimeout(10 * time.Second)}, opts...)
	lim, err := httplimit.New(store, rules, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.WriteString(w, "ok")
})

// do sends a request through h in-process, from remote.
func do(h http.Handler, method, target, remote string, header http.Header) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, nil)
	r.RemoteAddr = remote
	for k, vs := range header {
		r.Header[k] = vs
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// sfItem is one member of a structured-field list, parsed.
type sfItem struct {
	Name   string
	Params map[string]any
}

// parseSF parses a draft field with a structured-field parser, as a client
// would; it fails the test on anything that is not a list of String items.
func parseSF(t *testing.T, h http.Header, field string) []sfItem {
	t.Helper()
	list, err := httpsfv.UnmarshalList(h.Values(field))
	if err != nil {
		t.Fatalf("%s %q: %v", field, h.Values(field), err)
	}
	var out []sfItem
	for _, m := range list {
		it, ok := m.(httpsfv.Item)
		if !ok {
			t.Fatalf("%s: %#v is not an item", field, m)
		}
		name, ok := it.Value.(string)
		if !ok {
			t.Fatalf("%s: %#v is not a String", field, it.Value)
		}
		p := map[string]any{}
		for _, k := range it.Params.Names() {
			p[k], _ = it.Params.Get(k)
		}
		out = append(out, sfItem{name, p})
	}
	return out
}

// remaining returns r of policy in the RateLimit field, or -1.
func remaining(t *testing.T, h http.Header, policy string) int64 {
	t.Helper()
	for _, it := range parseSF(t, h, "RateLimit") {
		if it.Name == policy {
			return it.Params["r"].(int64)
		}
	}
	return -1
}

// problem is the RFC 9457 problem details object a rejection's body holds,
// as a client reads it.
type problem struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail,omitempty"`
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
	RetryAfter       int64    `json:"retry-after,omitempty"`
}

// The problem types of the rate-limit draft (section 5).
const (
	quotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	reducedCap    = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
)

func decodeProblem(t *testing.T, resp *http.Response) problem {
	t.Helper()
	if got := resp.Header.Get("Content-Type"); got != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json", got)
	}
	var p problem
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		t.Fatalf("problem body: %v", err)
	}
	return p
}
