// Package settings holds what a door's options set: the options of
// httplimit and grpclimit are enforce.Options, functions of a *Door, so
// that one option means the same at every door and one list of them can
// configure both. The rule machinery (internal/door/ruleset) fills in the
// defaults and reads the rest.
package settings

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate/clientip"
	"github.com/tollgate/tollgate/headers"
)

// Door is what a door's options set. Options are applied in order to a
// Door holding the defaults (ruleset.Resolve), so each replaces what the
// default or an earlier option set.
type Door struct {
	Timeout        time.Duration         // enforce.WithTimeout
	Registry       prometheus.Registerer // enforce.WithRegistry; nil: no metrics
	Logger         *slog.Logger          // enforce.WithLogger
	LogEvery       time.Duration         // enforce.WithLogInterval
	Now            func() time.Time      // the clock of X-RateLimit-Reset and of the log pace
	ClientIP       *clientip.Resolver    // enforce.WithClientIP
	Flavor         headers.Flavor        // enforce.WithHeaders
	FailRetryAfter time.Duration         // enforce.WithFailClosedRetryAfter
	// Reject is a door's own way of writing a rejection (httplimit's
	// WithRejectHandler), of that door's type; nil: the door's default.
	Reject any
}
