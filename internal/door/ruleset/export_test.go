package ruleset

import (
	"context"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/door/settings"
)

// TestEngine is the engine under the decision loop of Rules, made from
// Rules' options, for the external tests.
type TestEngine struct {
	e   *engine.Engine
	set settings.Door
}

// New returns the engine Rules would make from store and opts.
func New(store tollgate.Store, opts ...enforce.Option) *TestEngine {
	set := Resolve(opts)
	return &TestEngine{e: newEngine(store, set), set: set}
}

// WithClock sets the clock that paces failure logs.
func WithClock(now func() time.Time) enforce.Option {
	return func(s *settings.Door) { s.Now = now }
}

// TestRule is a prepared rule on an engine.
type TestRule struct {
	e   *engine.Engine
	r   *rule
	now func() time.Time
}

// Rule prepares a rule on the engine.
func (t *TestEngine) Rule(name string, mode enforce.FailureMode, dryRun bool) (TestRule, error) {
	r, err := newRule(nil, name, mode, dryRun)
	if err == nil {
		r.together = t.e.Combines()
	}
	return TestRule{t.e, r, t.set.Now}, err
}

func (r TestRule) Decide(ctx context.Context, key string, policies []enforce.Policy, cost int, dst []headers.Decision) (Verdict, []headers.Decision) {
	q := r.e.Begin(ctx)
	defer q.End()
	return r.r.decide(&q, key, policies, cost, dst, 0, nil, nil, r.now)
}

// FailureMode is the rule's failure mode after defaults.
func (r TestRule) FailureMode() enforce.FailureMode { return r.r.point.Mode }

// Deadline is the context a request's store calls get.
func (t *TestEngine) Deadline(ctx context.Context) (context.Context, context.CancelFunc) {
	q := t.e.Begin(ctx)
	return q.Context(), q.End
}

// Begin starts a request on the engine.
func (t *TestEngine) Begin(ctx context.Context) engine.Request { return t.e.Begin(ctx) }

var CheckPolicies = checkPolicies

// PolicyMade is the RateLimit-Policy value Decide left in s ("" for none).
func (s *Scratch) PolicyMade() string { return s.policy }
