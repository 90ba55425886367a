package service

import (
	"net/http/httptest"

	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate/tollgate/internal/service/config"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/memorystore"
)

const edgeRules = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"

// newLoggedServer is a server on edgeRules whose records are kept, with
// a clock the test sets.
func newLoggedServer(t *testing.T, opts ...Option) (*Server, *testkit.Logs, *testkit.Clock) {
	t.Helper()
	logs := &testkit.Logs{}
	clock := testkit.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s, err := New(memorystore.New(memorystore.WithClock(clock.Now)),
		append([]Option{WithClock(clock.Now), WithLogger(slog.New(logs))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := config.Parse("rules.yaml", []byte(edgeRules))
	if err != nil {
		t.Fatal(err)
	}
	s.SetRules(rules)
	return s, logs, clock
}

// TestUnmatchedLogged: a descriptor that no rule limits, because of a typo
// in its key or in the domain, is logged at WARN with the domain and the
// keys, never the values; one that a rule limits is not.
func TestUnmatchedLogged(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		domain string
		pairs  []string
		want   map[string]string // attributes of the one record; nil: none
	}{
		{"typo in the key", "edge", []string{"remote_adress", "203.0.113.7"},
			map[string]string{"domain": "edge", "keys": "remote_adress", "similar_events_not_logged": "0"}},
		{"typo in the domain", "edg", []string{"remote_address", "203.0.113.7"},
			map[string]string{"domain": "edg", "keys": "remote_address", "domains": "[edge]"}},
		{"a key too many", "edge", []string{"remote_address", "203.0.113.7", "api_key", "secret-203"},
			map[string]string{"domain": "edge", "keys": "remote_address,api_key"}},
		{"a long key", "edge", []string{strings.Repeat("k", 100), "203.0.113.7"},
			map[string]string{"keys": strings.Repeat("k", 64) + "…"}},
		{"matched", "edge", []string{"remote_address", "203.0.113.7"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, logs, _ := newLoggedServer(t)
			ask(t, s, req(tc.domain, entries(tc.pairs...)))
			recs, attrs := logs.Records(), logs.Attrs()
			if tc.want == nil {
				if len(recs) != 0 {
					t.Fatalf("records %v, want none", attrs)
				}
				return
			}
			if len(recs) != 1 {
				t.Fatalf("records %v, want 1", attrs)
			}
			if got := recs[0].Level; got != slog.LevelWarn {
				t.Errorf("level %v, want WARN", got)
			}
			for k, want := range tc.want {
				if got := attrs[0][k]; got != want {
					t.Errorf("%s = %q, want %q (record %v)", k, got, want, attrs[0])
				}
			}
			if line := fmt.Sprint(attrs[0]); strings.Contains(line, "203") {
				t.Errorf("record %s shows a value", line)
			}
		})
	}
}

// TestUnmatchedSampled: a flood of one kind of unmatched descriptor is
// logged once per log interval, saying how many were left out; kinds are
// sampled apart; and a flood of invented kinds costs at most one record
// per kind remembered, plus one.
func TestUnmatchedSampled(t *testing.T) {
	t.Parallel()
	s, logs, clock := newLoggedServer(t)
	typo := func(v string) { ask(t, s, req("edge", entries("remote_adress", v))) }
	for i := range 1000 {
		typo(fmt.Sprint(i))
	}
	ask(t, s, req("edg", entries("remote_address", "x")))
	if got := len(logs.Records()); got != 2 {
		t.Fatalf("%d records for 1000 of one kind and 1 of another, want 2: %v", got, logs.Attrs())
	}
	clock.Advance(5 * time.Second)
	typo("a")
	if got := len(logs.Records()); got != 2 {
		t.Fatalf("%d records 5 s later, want still 2", got)
	}
	clock.Advance(6 * time.Second) // past the default interval of 10 s
	typo("b")
	attrs := logs.Attrs()
	if len(attrs) != 3 {
		t.Fatalf("%d records past the interval, want 3", len(attrs))
	}
	if got, want := attrs[2]["similar_events_not_logged"], "1000"; got != want {
		t.Errorf("similar_events_not_logged %s, want %s", got, want)
	}

	before := len(logs.Records())
	for i := range 10_000 {
		ask(t, s, req("edge", entries(fmt.Sprintf("invented_%d", i), "v")))
	}
	if got, most := len(logs.Records())-before, 256+1; got > most {
		t.Errorf("%d records for 10,000 invented kinds at one instant, want at most %d", got, most)
	}
}

// TestUnmatchedEveryOne: with a log interval of 0, every unmatched
// descriptor is logged.
func TestUnmatchedEveryOne(t *testing.T) {
	t.Parallel()
	s, logs, _ := newLoggedServer(t, WithLogInterval(0))
	for range 3 {
		ask(t, s, req("edge", entries("remote_adress", "v")))
	}
	if got := len(logs.Records()); got != 3 {
		t.Errorf("%d records, want 3", got)
	}
}

// TestMissingValueLogged: an /auth request without the header its
// descriptor is keyed by is answered 200 without that limit, as Envoy
// answers it, but it is counted and logged (the keys and the header's
// name, never a value), so that a client who leaves the header out does
// not pass the limit unseen.
func TestMissingValueLogged(t *testing.T) {
	t.Parallel()
	s, logs, clock := newLoggedServer(t)
	h, err := s.AuthHandler(HTTPRules{Domain: "edge", Descriptors: []string{"api_key=header:X-Api-Key", "remote_address"}})
	if err != nil {
		t.Fatal(err)
	}
	send := func() int {
		r := httptest.NewRequest("GET", "/auth", nil)
		r.Header.Set("X-Original-URI", "/v1/things")
		r.Header.Set("X-Original-Method", "GET")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	for range 3 {
		if got := send(); got != 200 {
			t.Fatalf("status %d, want 200", got)
		}
	}
	if got := testutil.ToFloat64(s.m.noRule[noRuleMissing]); got != 3 {
		t.Errorf("no_rule_total{reason=missing_value} = %v, want 3", got)
	}
	var missing []map[string]string
	for _, a := range logs.Attrs() {
		if a["missing"] != "" {
			missing = append(missing, a)
		}
	}
	if len(missing) != 1 || missing[0]["keys"] != "api_key" || missing[0]["missing"] != "header:X-Api-Key" {
		t.Fatalf("records %v, want one naming api_key and header:X-Api-Key", logs.Attrs())
	}
	clock.Advance(time.Minute)
	send()
	if got := logs.Attrs()[len(logs.Attrs())-1]; got["similar_events_not_logged"] != "2" {
		t.Errorf("next record %v, want 2 left out", got)
	}
}
