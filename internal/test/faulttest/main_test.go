package faulttest

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/tollgate/tollgate/internal/test/redistest"
)

// quiet discards go-redis's log lines ("failed to dial after 5 attempts",
// ...), which an outage produces by the thousand. The tests see every
// failure through the error each decision returns.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// settleTime is how long the goroutines of closed go-redis clients get to
// exit before they count as leaked. Some exit only at their next tick: a
// pool that has failed to dial PoolSize times probes once a second
// (tryDial) until it is closed, and a cluster client's slot-map reload
// cools down for 200 ms. A leaked goroutine stays forever.
const settleTime = 5 * time.Second

func TestMain(m *testing.M) {
	redis.SetLogger(quiet{})
	code := m.Run()
	// Every test closes its clients and servers, so once all have run no
	// goroutine of theirs may be left: not a go-redis dialer stuck on a
	// paused server, not a load goroutine, not a process waiter.
	if code == 0 {
		if err := settle(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines left %v after the tests: %v\n", settleTime, err)
			code = 1
		}
	}
	os.Exit(code)
}

// settle waits up to settleTime for goleak to find no goroutine but the
// test runner's and redistest's process spawner.
func settle() error {
	deadline := time.Now().Add(settleTime)
	for {
		err := goleak.Find(goleak.IgnoreTopFunction(redistest.SpawnerFunc))
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
