package ruleset

import (
	"log/slog"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/clientip"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/door/settings"
)

// Resolve applies a door's options, in order, to the defaults: what
// NewRules and NewSlots take.
func Resolve(opts []enforce.Option) settings.Door {
	s := settings.Door{
		Timeout: enforce.DefaultTimeout, LogEvery: enforce.DefaultLogInterval, Now: time.Now,
		ClientIP: &clientip.Resolver{}, Flavor: headers.Draft, FailRetryAfter: time.Second,
	}
	for _, o := range opts {
		o(&s)
	}
	if s.Logger == nil {
		s.Logger = slog.Default()
	}
	if s.ClientIP == nil {
		s.ClientIP = &clientip.Resolver{}
	}
	return s
}

func newEngine(store tollgate.Store, s settings.Door) *engine.Engine {
	return engine.NewEngine(store, s.Timeout, s.Logger, s.LogEvery, s.Now)
}
