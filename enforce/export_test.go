package enforce

import (
	"context"
	"time"
)

// Bound exposes the shared-deadline context for tests.
func (e *Engine) Bound(ctx context.Context) context.Context { return e.deadlines.Bound(ctx) }

// SetNow replaces the clock used to rate-limit logs.
func (e *Engine) SetNow(now func() time.Time) { e.now = now }

var CheckPolicies = checkPolicies
