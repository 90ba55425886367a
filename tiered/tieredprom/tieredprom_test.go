package tieredprom_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/tiered"
	"github.com/tollgate/tollgate/tiered/tieredprom"
)

func TestRegister(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	s := tiered.New(memorystore.New(memorystore.WithClock(clock)), tiered.WithClock(clock), tiered.WithDenialCache())
	reg := prometheus.NewPedanticRegistry()
	if err := tieredprom.Register(reg, s, "api"); err != nil {
		t.Fatal(err)
	}
	if err := tieredprom.Register(reg, s, "api"); err == nil {
		t.Error("registering the same name twice: err = nil")
	}
	for range 5 { // 1 admitted (leaving nothing), 4 denied locally
		if _, err := s.AllowN(context.Background(), "k", tollgate.PerMinute(1), 1); err != nil {
			t.Fatal(err)
		}
	}
	want := `
# HELP tollgate_tiered_global_calls_total Calls to the global store (a lease taken is one).
# TYPE tollgate_tiered_global_calls_total counter
tollgate_tiered_global_calls_total{store="api"} 1
# HELP tollgate_tiered_local_denials_total Denials answered by the local tier without a global call.
# TYPE tollgate_tiered_local_denials_total counter
tollgate_tiered_local_denials_total{store="api"} 4
# HELP tollgate_tiered_breaker_state Circuit breaker state: 0 closed, 1 open, 2 half-open.
# TYPE tollgate_tiered_breaker_state gauge
tollgate_tiered_breaker_state{store="api"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"tollgate_tiered_global_calls_total", "tollgate_tiered_local_denials_total", "tollgate_tiered_breaker_state"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 11 {
		t.Errorf("%d series (%v), want 11", n, err)
	}
}
