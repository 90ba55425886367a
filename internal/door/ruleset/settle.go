package ruleset

import (
	"context"
	"errors"
	"log/slog"
	"strconv"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/door/engine"
)

// A rule that settles (Spec.Settles) reserves its cost as an estimate
// through the store's ReserveN, and once the response is done, corrects
// each policy that admitted the request by the real cost the transport
// read from the response (Rules.Settle). The store calls of a settle run
// after the response, on a goroutine of their own, so that the client
// never waits for them; they are bounded by the same deadline as every
// store call (WithTimeout), on a context the end of the request does not
// cancel, and a failure is counted and logged like any other, the
// estimate then standing. A request the rules turn away was not served:
// what it reserved is refunded.

// held is one policy's reservation, waiting for the request's real cost.
type held struct {
	rule   int // index of the rule in Rules.rules
	policy string
	key    string
	limit  tollgate.Limit
	at     int64 // the store's clock at the reservation
	cost   int   // the estimate reserved
	actual int   // the real cost, once known
}

// Settle corrects the reservations the request whose Scratch is s made
// under rules that settle: actual(rule) gives the real cost under the
// rule at that index of the specs given to NewRules, once per rule with
// reservations, called before Settle returns (it may read the response);
// ok false leaves the estimate standing. An error from actual, or a
// negative cost, means the response reported a cost that cannot be used:
// the estimate stands, and it is counted (bad_costs_total) and logged,
// sampled, with the error's text, which must not hold the value.
// The store calls run in the background and Settle returns at once; Drain
// waits for them. ctx is the request's: its values are kept, its end does
// not cancel the settle.
func (rs *Rules[Req]) Settle(ctx context.Context, s *Scratch, actual func(rule int) (n int, ok bool, err error)) {
	if s == nil || len(s.held) == 0 {
		return
	}
	hs := s.held
	s.held = nil
	for i := range hs {
		h := &hs[i]
		if i > 0 && hs[i-1].rule == h.rule {
			h.actual = hs[i-1].actual // one response, one cost per rule
			continue
		}
		n, ok, err := actual(h.rule)
		if err == nil && ok && n < 0 {
			err = ErrCostNotCount
		}
		if err != nil {
			rs.badCost(ctx, h.rule, err)
		}
		if err != nil || !ok {
			n = h.cost
		}
		h.actual = n
	}
	rs.settleLater(ctx, hs)
}

// Holds reports whether the request holds reservations to settle.
func (s *Scratch) Holds() bool { return len(s.held) > 0 }

// Refund gives back everything the request whose Scratch is s reserved:
// for a request that was not served after all (a shaping delay it could
// not wait). Decide already refunds the requests it turns away.
func (rs *Rules[Req]) Refund(ctx context.Context, s *Scratch) {
	if s == nil || len(s.held) == 0 {
		return
	}
	hs := s.held
	s.held = nil
	for i := range hs {
		hs[i].actual = 0
	}
	rs.settleLater(ctx, hs)
}

// Drain waits until the settles already started have reached the store or
// given up, or until ctx ends (its error then). Call it when shutting down,
// after the server has stopped taking requests, so that the last
// corrections are not lost; tests call it to see a settle's effect.
func (rs *Rules[Req]) Drain(ctx context.Context) error {
	return rs.engine.Drain(ctx)
}

// settleLater makes the store calls of hs on a goroutine of their own,
// sharing one deadline.
func (rs *Rules[Req]) settleLater(ctx context.Context, hs []held) {
	if !hasCorrection(hs) {
		return
	}
	ctx = context.WithoutCancel(ctx)
	e := rs.engine
	e.Later(func() {
		q := e.Begin(ctx)
		defer q.End()
		for i := range hs {
			h := &hs[i]
			_ = q.Settle(&rs.rules[h.rule].r.point, h.policy, h.key, h.limit, h.at, h.cost, h.actual)
		}
	})
}

func hasCorrection(hs []held) bool {
	for i := range hs {
		if hs[i].actual != hs[i].cost {
			return true
		}
	}
	return false
}

// badCost counts and logs (sampled, apart from store failures) a real
// cost the response reported that cannot be used. Never the value: it
// comes from a handler, and may be anything.
func (rs *Rules[Req]) badCost(ctx context.Context, rule int, err error) {
	r := rs.rules[rule].r
	if r.m.badCosts != nil {
		r.m.badCosts.Inc()
	}
	ok, skipped := rs.badLog.Allow(rs.set.Now())
	if !ok {
		return
	}
	rs.set.Logger.LogAttrs(context.WithoutCancel(ctx), slog.LevelWarn, "tollgate: the response reported a cost that cannot be used; the estimate stands",
		slog.String("rule", r.name), slog.String("error", err.Error()), engine.Skipped(skipped))
}

// MaxActual is the largest real cost ParseCost accepts: 2^53 − 1, the
// largest integer every store counts exactly. A store bounds what one
// settle can charge much lower (tollgate.CheckSettle: the policy's
// Capacity plus MaxDebt beyond the estimate).
const MaxActual = 1<<53 - 1

// Reasons ParseCost gives for a value it refuses. They never hold the
// value.
var (
	ErrCostSeveral  = errors.New("several values")
	ErrCostNotCount = errors.New("not a whole number of 0 or more")
	ErrCostTooLarge = errors.New("larger than 2^53 − 1")
)

// ParseCost reads the real cost a response reports in a header, trailer or
// metadata key whose values are vs: exactly one value, the decimal digits
// of a number from 0 to MaxActual, spaces around it allowed. ok is false
// when there is none (the estimate stands, and nothing is wrong); err says
// why a value present cannot be used.
func ParseCost(vs []string) (n int, ok bool, err error) {
	switch len(vs) {
	case 0:
		return 0, false, nil
	case 1:
	default:
		return 0, true, ErrCostSeveral
	}
	v := trimSpace(vs[0])
	if v == "" {
		return 0, true, ErrCostNotCount
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			if v[i] == ',' {
				return 0, true, ErrCostSeveral // a list folded into one line
			}
			return 0, true, ErrCostNotCount
		}
	}
	u, err := strconv.ParseUint(v, 10, 64)
	if err != nil || u > MaxActual {
		return 0, true, ErrCostTooLarge // only digits: too many of them
	}
	return int(u), true, nil
}

func trimSpace(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}
