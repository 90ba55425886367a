package ruleset

import (
	"context"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/headers"
)

// Engine, New, Rule and Decide expose the engine under the decision loop
// of Rules to the external tests.
type Engine = engine

func New(store tollgate.Store, opts ...Option) *Engine { return newEngine(store, newSettings(opts)) }

func (e *engine) Rule(name string, mode FailureMode, dryRun bool) (*rule, error) {
	return e.rule(name, mode, dryRun)
}

func (r *rule) Decide(ctx context.Context, key string, policies []Policy, cost int, dst []headers.Decision) (Verdict, []headers.Decision) {
	return r.decide(ctx, key, policies, cost, dst)
}

// FailureMode is the rule's failure mode after defaults.
func (r *rule) FailureMode() FailureMode { return r.mode }

// Bound exposes the shared-deadline context for tests.
func (e *engine) Bound(ctx context.Context) context.Context { return e.deadlines.Bound(ctx) }

// SetNow replaces the clock used to rate-limit logs.
func (e *engine) SetNow(now func() time.Time) { e.now = now }

var CheckPolicies = checkPolicies
