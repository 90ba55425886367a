package ruleset

import (
	"context"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/headers"
)

// New, Rule, Decide and Deadline expose the engine under the decision loop
// of Rules to the external tests.
func New(store tollgate.Store, opts ...Option) *Engine { return newEngine(store, newSettings(opts)) }

// TestRule is a prepared rule on an engine.
type TestRule struct {
	e *Engine
	r *rule
}

func (e *Engine) Rule(name string, mode FailureMode, dryRun bool) (TestRule, error) {
	r, err := newRule(nil, name, mode, dryRun)
	return TestRule{e, r}, err
}

func (r TestRule) Decide(ctx context.Context, key string, policies []Policy, cost int, dst []headers.Decision) (Verdict, []headers.Decision) {
	q := r.e.Begin(ctx)
	defer q.End()
	return r.r.decide(&q, key, policies, cost, dst, 0, nil)
}

// FailureMode is the rule's failure mode after defaults.
func (r TestRule) FailureMode() FailureMode { return r.r.point.Mode }

// Deadline is the context a request's store calls get.
func (e *Engine) Deadline(ctx context.Context) (context.Context, context.CancelFunc) {
	q := e.Begin(ctx)
	return q.Context(), q.End
}

// SetNow replaces the clock used to rate-limit logs.
func (e *Engine) SetNow(now func() time.Time) { e.now = now }

var CheckPolicies = checkPolicies
