package faulttest

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/tollgate/tollgate/internal/redistest"
)

// quiet discards go-redis's log lines ("failed to dial after 5 attempts",
// ...), which an outage produces by the thousand. The tests see every
// failure through the error each decision returns.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	redis.SetLogger(quiet{})
	// Every test closes its clients and servers, so once all have run no
	// goroutine of theirs may be left: not a go-redis dialer stuck on a
	// paused server, not a load goroutine, not a process waiter.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction(redistest.SpawnerFunc))
}
