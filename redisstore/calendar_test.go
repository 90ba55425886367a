package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/redisstore"
)

// TestCalendarKey: a calendar window's Redis key names its unit and zone,
// apart from the epoch window of the same key and from other zones.
func TestCalendarKey(t *testing.T) {
	t.Parallel()
	s := redisstore.New(nil)
	for _, tc := range []struct {
		limit tollgate.Limit
		want  string
	}{
		{tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 5, Period: 24 * time.Hour}, "tollgate:{k}:fw:86400000000"},
		{tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 5, Calendar: tollgate.Calendar{Unit: "month", Zone: "Europe/Berlin"}}, "tollgate:{k}:fw:month@Europe/Berlin"},
		{tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 5, Calendar: tollgate.Calendar{Unit: "day", Zone: "UTC"}}, "tollgate:{k}:swc:day@UTC"},
	} {
		if got := s.Key("k", tc.limit); got != tc.want {
			t.Errorf("Key(k, %v) = %q, want %q", tc.limit, got, tc.want)
		}
	}
}

// TestCalendarServerClock: on the server's clock (no WithClock) a calendar
// month's ResetAfter runs to the month's end in the zone, as Redis's TIME
// sees it, on a standalone server and a Cluster.
func TestCalendarServerClock(t *testing.T) {
	t.Parallel()
	for _, topo := range []struct {
		name   string
		client func(*testing.T) *redisstore.Store
	}{
		{"standalone", func(t *testing.T) *redisstore.Store { return redisstore.New(standalone(t)) }},
		{"cluster", func(t *testing.T) *redisstore.Store { return redisstore.New(clustered(t)) }},
	} {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			s := topo.client(t)
			ctx := context.Background()
			limit := tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 3, Calendar: tollgate.Calendar{Unit: "month", Zone: "Asia/Tokyo"}}
			key := "calendar:" + t.Name()
			before := time.Now()
			res, now, err := s.ReserveN(ctx, key, limit, 2)
			if err != nil {
				t.Fatal(err)
			}
			tokyo, _ := time.LoadLocation("Asia/Tokyo")
			server := time.UnixMicro(now).In(tokyo)
			end := time.Date(server.Year(), server.Month()+1, 1, 0, 0, 0, 0, tokyo)
			if got, want := res.ResetAfter, end.Sub(server); !res.Allowed || got != want || res.Remaining != 1 {
				t.Errorf("%+v at the server's %v: want allowed, remaining 1, ResetAfter %v (to %v)", res, server, want, end)
			}
			if d := time.UnixMicro(now).Sub(before); d < -time.Minute || d > time.Minute {
				t.Errorf("the decision's time %v is %v from the test's clock: want the server's", server, d)
			}
		})
	}
}

// TestCalendarSkew: a script given window edges that do not hold the
// server's time (a clock skewed by more than a window) answers an error,
// and decides nothing.
func TestCalendarSkew(t *testing.T) {
	t.Parallel()
	rdb := standalone(t)
	ctx := context.Background()
	limit := tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 3, Calendar: tollgate.Calendar{Unit: "day", Zone: "UTC"}}
	// The edges come from this clock, two weeks behind the server's.
	skewed := time.Now().Add(-14 * 24 * time.Hour)
	s := redisstore.New(rdb)
	redisstore.SetEdgeClock(s, func() time.Time { return skewed })
	_, err := s.AllowN(ctx, "skew", limit, 1)
	if err == nil || !strings.Contains(err.Error(), "outside the calendar windows") || !strings.HasPrefix(err.Error(), "redisstore: ") {
		t.Fatalf("AllowN with edges two weeks off = %v, want a redisstore error saying the server's time is outside the calendar windows", err)
	}
	if n, err := rdb.Exists(ctx, s.Key("skew", limit)).Result(); err != nil || n != 0 {
		t.Errorf("the key exists (%d, %v) after a refused decision", n, err)
	}
}
