package enforce_test

import (
	"fmt"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/httplimit"
	"github.com/tollgate/tollgate/memorystore"
)

// A tighter limit for a tenth of the keys first, from New Year's Day; the
// others try it in shadow, so its would-be 429s are counted before it
// applies to anyone.
func ExampleRollout() {
	policy := enforce.Policy{
		Name:  "api",
		Limit: tollgate.PerMinute(100),
		Rollout: &enforce.Rollout{
			Limit:   tollgate.PerMinute(60),
			Percent: 10,
			From:    time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC),
			Shadow:  true,
		},
	}
	_, err := httplimit.New(memorystore.New(), []httplimit.Rule{{Name: "api", Policies: []enforce.Policy{policy}}})
	fmt.Println(err)

	// A rollout keeps the policy's algorithm and period, so that a key
	// entering it keeps what it has spent.
	policy.Rollout.Limit = tollgate.PerHour(3600)
	_, err = httplimit.New(memorystore.New(), []httplimit.Rule{{Name: "api", Policies: []enforce.Policy{policy}}})
	fmt.Println(err != nil)
	// Output:
	// <nil>
	// true
}
