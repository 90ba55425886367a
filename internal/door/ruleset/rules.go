package ruleset

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/clientip"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/door/settings"
	"github.com/tollgate/tollgate/internal/door/storekey"
	"github.com/tollgate/tollgate/internal/headerfmt"
	"github.com/tollgate/tollgate/internal/store/lentkeys"
)

// Spec is one rule as a transport hands it to NewRules, over requests of
// type Req (whatever the transport needs to see a request: an
// *http.Request, a gRPC context and method). The transport supplies the
// matching (Applies) and the key sources; Rules does the rest.
type Spec[Req any] struct {
	// Name identifies the rule in store keys, metrics and logs.
	Name string
	// Applies, if set, must return true for the rule to apply.
	Applies func(Req) bool
	// Key says whom a request is counted against; the zero Key is the
	// default key given to NewRules.
	Key Key[Req]
	// Policies are the limits, checked in order.
	Policies []enforce.Policy
	// PoliciesFunc, if set, picks the policies per request instead; nil
	// or empty means the rule does not apply.
	PoliciesFunc func(Req) []enforce.Policy
	// Cost, if set, says what a request spends (default 1); below 1 the
	// rule does not count it.
	Cost func(Req) int
	// FailureMode: FailOpen or FailClosed; FailDefault fails open.
	FailureMode enforce.FailureMode
	// DryRun rules report but never block.
	DryRun bool
	// Settles makes Cost an estimate: the rule reserves it through the
	// store's ReserveN, and Settle corrects it by the real cost once the
	// response is done. The store must be a tollgate.Settler.
	Settles bool
}

// Rules is an ordered list of prepared rules over requests of type Req:
// the decision loop every transport shares. Make it with NewRules at start;
// it is safe for concurrent use.
type Rules[Req any] struct {
	rules   []prepared[Req]
	metrics *Metrics // nil: none recorded
	engine  *engine.Engine
	set     settings.Door
	pkg     string // starts error messages
	settles bool   // some rule settles
	// lend: the store copies a key it keeps, so the rules that do not
	// settle lend it keys in a reused buffer (internal/store/lentkeys).
	lend bool
	// rollouts: some rule has a policy with a rollout, or picks its
	// policies per request (which may have one)
	rollouts bool
	// badLog paces the logs of unusable real costs, apart from store
	// failures.
	badLog engine.Sampler
}

type prepared[Req any] struct {
	applies      func(Req) bool
	key          Key[Req]
	prefix       string // "<rule>:<kind>:"
	policies     []enforce.Policy
	policiesFunc func(Req) []enforce.Policy
	cost         func(Req) int
	settles      bool
	r            *rule
	// policyField is RateLimit-Policy's value when the rule's decisions
	// on a request are one per policy, in order, each under the policy's
	// limit (see policyField); "" when the policies are picked per
	// request or announce a rollout.
	policyField string
}

// MaxRules is how many rules one Rules takes. Each rule is about twenty
// series of the metrics labelled by rule (five outcomes, a histogram of
// the store's latency, errors, bad costs), so 256 rules are some 5,000
// series per door at most; a rule's key, not more rules, tells callers
// apart.
const MaxRules = 256

// NewRules prepares specs against store under the door's settings set (see
// Resolve): it checks every rule and every static policy and returns the
// first problem, its message starting with pkg. Metrics registered on
// set.Registry are named tollgate_<subsystem>_…; a Spec's zero Key means
// def. There can be at most MaxRules specs.
func NewRules[Req any](pkg, subsystem string, store tollgate.Store, def Key[Req], specs []Spec[Req], set settings.Door) (*Rules[Req], error) {
	if store == nil {
		return nil, errors.New(pkg + ": nil store")
	}
	if len(specs) > MaxRules {
		return nil, fmt.Errorf("%s: %d rules, more than %d: key the requests of one rule apart (Key) rather than making a rule each", pkg, len(specs), MaxRules)
	}
	var metrics *Metrics
	if set.Registry != nil {
		m, err := NewMetrics(set.Registry, subsystem)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", pkg, err)
		}
		metrics = m
	}
	rs := &Rules[Req]{metrics: metrics, engine: newEngine(store, set), set: set, pkg: pkg, lend: lentkeys.Lend(store)}
	rs.badLog.Every = set.LogEvery
	seen := map[string]bool{}
	for _, s := range specs {
		p, err := prepare(metrics, def, s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", pkg, err)
		}
		p.r.together = rs.engine.Combines()
		if s.Settles && !rs.engine.Settles() {
			return nil, fmt.Errorf("%s: rule %q settles its cost after the response, but %T cannot settle reservations (memorystore and redisstore can)", pkg, s.Name, store)
		}
		for _, pol := range s.Policies {
			if s.Settles && pol.Limit.Calendar != (tollgate.Calendar{}) {
				return nil, fmt.Errorf("%s: rule %q settles its cost after the response, but policy %q counts in calendar windows, which cannot be settled", pkg, s.Name, pol.Name)
			}
		}
		if seen[s.Name] {
			return nil, fmt.Errorf("%s: two rules named %q", pkg, s.Name)
		}
		seen[s.Name] = true
		rs.settles = rs.settles || s.Settles
		rs.rollouts = rs.rollouts || s.PoliciesFunc != nil || slices.ContainsFunc(s.Policies, func(p enforce.Policy) bool { return p.Rollout != nil })
		rs.rules = append(rs.rules, p)
	}
	return rs, nil
}

func prepare[Req any](m *Metrics, def Key[Req], s Spec[Req]) (prepared[Req], error) {
	r, err := newRule(m, s.Name, s.FailureMode, s.DryRun)
	if err != nil {
		return prepared[Req]{}, err
	}
	key := s.Key.orDefault(def)
	if err := key.check(); err != nil {
		return prepared[Req]{}, fmt.Errorf("rule %q: %w", s.Name, err)
	}
	if s.PoliciesFunc == nil {
		if err := checkPolicies(s.Policies); err != nil {
			return prepared[Req]{}, fmt.Errorf("rule %q: %w", s.Name, err)
		}
	} else if len(s.Policies) > 0 {
		return prepared[Req]{}, fmt.Errorf("rule %q: set Policies or PoliciesFunc, not both", s.Name)
	}
	return prepared[Req]{
		applies: s.Applies, key: key, prefix: s.Name + ":" + key.kindName() + ":",
		policies: s.Policies, policyField: policyField(s.Policies, s.DryRun), policiesFunc: s.PoliciesFunc,
		cost: s.Cost, settles: s.Settles, r: r,
	}, nil
}

// policyField returns the value of RateLimit-Policy for the decisions of a
// rule (dry run or not) under policies, one per policy in order, each
// under its policy's limit: the same on every request, so made once here
// and not on each response. It is "" for no policies, or when a policy has
// a rollout, whose announcement is one more item.
func policyField(policies []enforce.Policy, dryRun bool) string {
	if len(policies) == 0 || slices.ContainsFunc(policies, func(p enforce.Policy) bool { return p.Rollout != nil }) {
		return ""
	}
	ds := make([]headers.Decision, len(policies))
	for i, p := range policies {
		ds[i] = headers.Decision{Policy: p.Name, Result: tollgate.Result{Limit: p.Limit}, DryRun: dryRun}
	}
	h := http.Header{}
	headers.Write(h, headers.Draft, time.Time{}, ds...)
	return h.Get("RateLimit-Policy")
}

// madeOf reports whether ds, the decisions of the rule p on one request,
// are those policyField was made of: one per policy, in order, each named
// for it, under its limit and the rule's dry run, and none an
// announcement. Then p.policyField is their RateLimit-Policy.
func (p *prepared[Req]) madeOf(ds []headers.Decision, policies []enforce.Policy) bool {
	if p.policyField == "" || len(ds) != len(policies) {
		return false
	}
	for i := range ds {
		d, pol := &ds[i], &policies[i]
		if d.Policy != pol.Name || d.Result.Limit != pol.Limit || d.DryRun != p.r.dryRun || !d.From.IsZero() || d.PolicyOnly {
			return false
		}
	}
	return true
}

// Scratch is room for the context of a request's store calls, which
// escapes to the store: a transport that allocates memory of its own for
// each request keeps a Scratch in it, and Decide allocates nothing for the
// context. A Scratch serves one request: a store may keep the context it
// was given.
type Scratch struct {
	ctx  engine.Room
	held []held // reservations of rules that settle
	// policy is the value of RateLimit-Policy for the decisions Decide
	// appended, when it was made beforehand (one rule decided); "" when
	// it must be made from them.
	policy string
	// arms holds the arm of each policy with a rollout that decided the
	// request, when metrics are recorded (Served times it by arm). It is
	// allocated when the first is seen, not kept in the Scratch: only
	// requests under a rollout need it, and every request carries the
	// Scratch.
	arms []armSeen
}

// keyBuffer is where Decide builds store keys. It would escape to the heap
// (the rules' key funcs see it), and a request's keys are done with when
// Decide returns (the store gets a copy), so buffers are reused, from
// keyBuffers: a request allocates only its keys' strings, and none when
// the store is lent its keys (a rule that settles keeps its keys after
// Decide, and always gets strings of their own).
type keyBuffer [160]byte // a longer key grows on the heap

var keyBuffers = sync.Pool{New: func() any { return new(keyBuffer) }}

// Decide applies every rule that matches req, in order, appending their
// decisions to dst. It stops at the first verdict that blocks and returns
// it (its Rule names the rule); otherwise it returns an Allowed verdict
// whose Delay is the longest shaping delay of the rules. s is the
// request's Scratch; if nil, Decide allocates one when a rule applies.
// Rules that settle keep their reservations in s, for Settle; a request
// Decide turns away gets them refunded. When RateLimit-Policy's value for
// the decisions is known beforehand, Decide leaves it in s (Policy).
func (rs *Rules[Req]) Decide(ctx context.Context, req Req, dst []headers.Decision, s *Scratch) (Verdict, []headers.Decision) {
	var delay time.Duration
	// policy is RateLimit-Policy's value for dst, made beforehand, while
	// dst holds the decisions of one rule, those its field was made of;
	// "" otherwise.
	policy, alone := "", len(dst) == 0
	q := rs.engine.Begin(ctx)
	defer q.End()
	kb := keyBuffers.Get().(*keyBuffer)
	defer keyBuffers.Put(kb)
	for i := range rs.rules {
		p := &rs.rules[i]
		if p.applies != nil && !p.applies(req) {
			continue
		}
		policies := p.policies
		if p.policiesFunc != nil {
			if policies = p.policiesFunc(req); len(policies) == 0 {
				continue
			}
		}
		cost := 1
		if p.cost != nil {
			if cost = p.cost(req); cost < 1 {
				continue
			}
		}
		if s == nil {
			s = new(Scratch)
		}
		q.UseRoom(&s.ctx)
		b := append(kb[:0], p.prefix...)
		b, ok := p.key.appendValue(b, req)
		if !ok {
			continue
		}
		var v Verdict
		var hold *[]held
		if p.settles {
			hold = &s.held
		}
		var arms *[]armSeen
		if rs.metrics != nil {
			arms = &s.arms
		}
		before := len(dst)
		var key string
		if rs.lend && !p.settles {
			// Lent: valid until the store call returns, as nothing
			// else keeps it (derived keys, of rollouts and penalties,
			// are strings of their own).
			b = storekey.Bytes(b, len(p.prefix))
			key = unsafe.String(unsafe.SliceData(b), len(b))
		} else {
			key = storekey.String(b, len(p.prefix))
		}
		v, dst = p.r.decide(&q, key, policies, cost, dst, i, hold, arms, rs.set.Now)
		if len(dst) > before {
			policy = ""
			if alone && p.madeOf(dst[before:], policies) {
				policy = p.policyField
			}
			alone = false
		}
		s.policy = policy
		if v.Outcome.Blocks() {
			rs.Refund(ctx, s) // not served: nothing spent
			return v, dst
		}
		delay = max(delay, v.Delay)
	}
	return Verdict{Outcome: engine.Allowed, Delay: delay}, dst
}

// Start is when a request the transport times for Served begins: now, or
// the zero Time when no metrics are recorded (no registry), which Served
// ignores, so that an untimed request does not read the clock.
func (rs *Rules[Req]) Start() time.Time {
	if rs.metrics == nil {
		return time.Time{}
	}
	return time.Now()
}

// Served records that a request which began at start (Start) has left as
// s: tollgate_<subsystem>_request_duration_seconds{decision}, and when sc,
// the Scratch Decide was given, says policies with a rollout decided it,
// tollgate_<subsystem>_rollout_request_duration_seconds under their arms.
// sc may be nil (then no arm is recorded).
func (rs *Rules[Req]) Served(start time.Time, s Served, sc *Scratch) {
	if rs.metrics == nil || start.IsZero() {
		return
	}
	var arms []armSeen
	if sc != nil {
		arms = sc.arms
	}
	rs.metrics.observe(s, time.Since(start), arms)
}

// Times reports whether Served times requests by arm: a transport that
// passes Decide no Scratch must give it one then, for Served to read.
func (rs *Rules[Req]) Times() bool { return rs.metrics != nil && rs.rollouts }

// Settles reports whether any rule settles (Spec.Settles): a transport
// that passes Decide no Scratch must give it one then, to Settle with.
func (rs *Rules[Req]) Settles() bool { return rs.settles }

// Flavor is the header flavours set with WithHeaders (default
// headers.Draft).
func (rs *Rules[Req]) Flavor() headers.Flavor { return rs.set.Flavor }

// FailClosedRetryAfter is when a client turned away by a fail-closed rule
// should come back (WithFailClosedRetryAfter, default 1 s).
func (rs *Rules[Req]) FailClosedRetryAfter() time.Duration { return rs.set.FailRetryAfter }

// Now reads the clock set with WithClock (default time.Now).
func (rs *Rules[Req]) Now() time.Time { return rs.set.Now() }

// Sleep waits d, the shaping delay of an admitted request, or until ctx
// ends. It gives up at once when ctx's deadline is sooner than d: the
// request cannot make it, so it should not wait. Its errors wrap
// context.DeadlineExceeded or ctx's error (and its cause, if another).
func (rs *Rules[Req]) Sleep(ctx context.Context, d time.Duration) error {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return fmt.Errorf("%s: shaping delay %v exceeds the request deadline: %w", rs.pkg, d, context.DeadlineExceeded)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		if err, cause := ctx.Err(), context.Cause(ctx); cause != err {
			return fmt.Errorf("%s: request ended during its shaping delay: %w: %w", rs.pkg, err, cause)
		}
		return fmt.Errorf("%s: request ended during its shaping delay: %w", rs.pkg, ctx.Err())
	case <-t.C:
		return nil
	}
}

// ClientIP is the resolver set with WithClientIP (default: the peer
// address).
func (rs *Rules[Req]) ClientIP() *clientip.Resolver { return rs.set.ClientIP }

// WriteHeaders sets in h the rate-limit fields of ds, the decisions Decide
// appended for a request whose Scratch is s, in the flavours set with
// WithHeaders, as headers.Write does, byte for byte. The fields' slices
// go in fields and their values' text in text when there is room
// (headerfmt.Write): memory of the response's own, kept by h, which must
// not be written again. RateLimit-Policy is the value made beforehand
// when Decide left one in s.
func (rs *Rules[Req]) WriteHeaders(h http.Header, s *Scratch, fields []string, text []byte, ds []headers.Decision) {
	if len(ds) == 0 {
		return
	}
	var now time.Time
	if rs.set.Flavor&headers.XRateLimit != 0 {
		now = rs.set.Now() // only X-RateLimit-Reset needs the time
	}
	headerfmt.Write(h, headerfmt.Flavor(rs.set.Flavor), now, fields, text, s.policy, fmtDecisions(ds))
}

// fmtDecisions is ds as headerfmt's Decisions, which are field for field
// the same: the conversion below compiles only while they are.
func fmtDecisions(ds []headers.Decision) []headerfmt.Decision {
	return unsafe.Slice((*headerfmt.Decision)(unsafe.Pointer(unsafe.SliceData(ds))), len(ds))
}

var _ = headerfmt.Decision(headers.Decision{})
