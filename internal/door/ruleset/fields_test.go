package ruleset_test

import (
	"context"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/door/ruleset"
	"github.com/tollgate/tollgate/memorystore"
)

// plainStore hides memorystore's AllowAll: a rule's policies are then
// decided one after another, up to the first that denies.
type plainStore struct{ tollgate.Store }

// TestWriteHeaders: the fields Rules.WriteHeaders sets, with the
// RateLimit-Policy value made beforehand where Decide left one and the
// text in a frame's room, are those headers.Write sets from the same
// decisions, in every flavour, whether requests are admitted or denied.
func TestWriteHeaders(t *testing.T) {
	t.Parallel()
	valueKey := ruleset.ValueKey("v", func(dst []byte, req string) ([]byte, bool) { return append(dst, req...), true })
	perHour := func(n int) tollgate.Limit { return tollgate.PerHour(n) }
	dryRun := ruleset.Spec[string]{Name: "shadow", Key: valueKey, DryRun: true, Policies: []enforce.Policy{{Name: "try", Limit: perHour(1)}}}
	for _, tc := range []struct {
		name  string
		plain bool // no AllowAll
		specs []ruleset.Spec[string]
		made  bool // the value is made beforehand on the first request
	}{
		{"one policy", false, []ruleset.Spec[string]{{Name: "api", Key: valueKey, Policies: []enforce.Policy{{Name: "api", Limit: perHour(2)}}}}, true},
		{"burst, sub-second period, window", false, []ruleset.Spec[string]{{Name: "api", Key: valueKey, Policies: []enforce.Policy{
			{Name: "burst", Limit: tollgate.Limit{Rate: 5, Period: 500 * time.Millisecond, Burst: 2}},
			{Name: "window", Limit: tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 3, Period: time.Minute}},
		}}}, true},
		{"two policies in turn", true, []ruleset.Spec[string]{{Name: "api", Key: valueKey, Policies: []enforce.Policy{
			{Name: "many", Limit: perHour(100)}, {Name: "few", Limit: tollgate.PerMinute(1)},
		}}}, true},
		{"the first of two denies", true, []ruleset.Spec[string]{{Name: "api", Key: valueKey, Policies: []enforce.Policy{
			{Name: "few", Limit: tollgate.PerMinute(1)}, {Name: "many", Limit: perHour(100)},
		}}}, true},
		{"dry run", false, []ruleset.Spec[string]{dryRun}, true},
		{"two rules", false, []ruleset.Spec[string]{
			{Name: "api", Key: valueKey, Policies: []enforce.Policy{{Name: "api", Limit: perHour(2)}}}, dryRun,
		}, false},
		{"policies per request", false, []ruleset.Spec[string]{{Name: "plan", Key: valueKey, PoliciesFunc: func(string) []enforce.Policy {
			return []enforce.Policy{{Name: "free", Limit: perHour(1)}}
		}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var store tollgate.Store = memorystore.New()
			if tc.plain {
				store = plainStore{store}
			}
			for _, f := range []headers.Flavor{headers.Draft, headers.Draft | headers.RateLimitFields | headers.XRateLimit} {
				now := time.Unix(1_800_000_000, 0)
				rs, err := ruleset.NewRules("test", "test", store, valueKey, tc.specs, ruleset.Resolve([]enforce.Option{
					enforce.WithHeaders(f), ruleset.WithClock(func() time.Time { return now }),
				}))
				if err != nil {
					t.Fatal(err)
				}
				key := tc.name + f.String()
				for i := range 3 { // admitted, then denied by the smallest limit
					s := new(ruleset.Scratch)
					_, ds := rs.Decide(context.Background(), key, nil, s)
					if made := s.PolicyMade() != ""; i == 0 && made != tc.made {
						t.Errorf("%v, request %d: RateLimit-Policy made beforehand: %v, want %v", f, i, made, tc.made)
					}
					got, want := http.Header{}, http.Header{}
					var fields [3]string
					var text [64]byte
					rs.WriteHeaders(got, s, fields[:], text[:], ds)
					headers.Write(want, f, now, ds...)
					if !reflect.DeepEqual(got, want) {
						t.Errorf("%v, request %d: WriteHeaders set\n%v\nwant\n%v", f, i, got, want)
					}
				}
			}
		})
	}
}
