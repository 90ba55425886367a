package model

import (
	"fmt"
	"math/big"
	"time"

	"github.com/tollgate/tollgate"
)

// The settle contract (tollgate.Settler), from its definition: a
// reservation of cost reserved admitted at the store's clock at is
// corrected at now by d = actual − reserved, bounded to a refund of at most
// reserved and a charge of at most Capacity + MaxDebt. A charge never
// lowers what a key has spent and a refund never raises it.
//
//   - Token bucket: tokens as a decision at now has them; a refund adds
//     up to a full bucket, a charge takes down to −MaxDebt (a debt).
//   - Leaky bucket: the level as a decision at now has it; a refund
//     drains down to empty, a charge fills up to Capacity + MaxDebt.
//   - GCRA: the arrival time as a decision at now uses it; a refund moves
//     it back by its intervals but not before now, a charge later but not
//     beyond now + (Burst + MaxDebt) intervals.
//   - Fixed window: a refund counts down the window of at, if it is the
//     key's; a charge counts up, to Rate + MaxDebt, the window a decision
//     at now counts in.
//   - Sliding window counter: a refund counts down the window of at if it
//     is the key's current window, or its previous one; a charge counts up
//     the current window a decision at now counts in.
//   - Sliding window log: a refund removes up to −d entries at at; a
//     charge adds entries at the key's time as a decision at now would
//     (dropping those that can never count again), up to Rate + MaxDebt.
//
// A key without live state is refunded nothing; a charge starts it fresh.
// A correction writes the state, kept until it is full again as an
// admission's (a correction that leaves it full forgets it); a settle that
// corrects nothing is a look.

// MaxDebt returns how much more than Capacity a key may owe under l after
// an extra charge: Rate for the fixed window and the sliding log; for the
// sliding counter Rate, or less where (Rate + MaxDebt) × steps would
// exceed 2^53/4 (steps: the period in its grains); for the buckets
// Capacity, or less where (Capacity + MaxDebt) × u would reach 2^53 (u the
// parts a token is counted in).
func MaxDebt(l tollgate.Limit) int64 {
	const max53 = 1 << 53
	rate := int64(l.Rate)
	switch l.Algorithm {
	case tollgate.FixedWindow, tollgate.SlidingWindowLog:
		return rate
	case tollgate.SlidingWindowCounter:
		if l.Calendar != (tollgate.Calendar{}) {
			return min(rate, max53/4/(32*86_400)-rate) // never settled: refused
		}
		steps := us(l.Period) / grain(us(l.Period))
		return min(rate, max53/4/steps-rate)
	default:
		c := Capacity(l)
		u := ratFrac(rate, us(l.Period)).Denom() // Rate/Period in lowest terms
		most := new(big.Int).Quo(big.NewInt(max53-1), u)
		return max(0, min(c, toInt64(most)-c))
	}
}

// SettleN corrects key's state under limit at now, for a reservation of
// cost reserved admitted at at, by actual − reserved, as the package doc
// and tollgate.Settler say. It returns the state as a look (n = 0) at now
// reports it, and whether it wrote. reserved 0 is a charge of actual with no
// reservation before it. A reserved cost below 0 or above
// Capacity, or an actual below 0, is ErrCost, and changes nothing.
func (m *Model) SettleN(key string, limit tollgate.Limit, at int64, reserved, actual int, now int64) (tollgate.Result, bool, error) {
	l := newLim(limit)
	if reserved < 0 || int64(reserved) > l.capacity || actual < 0 {
		return tollgate.Result{Limit: limit}, false, fmt.Errorf("%w: reserved %d, actual %d under %v (capacity %d)", ErrCost, reserved, actual, limit, l.capacity)
	}
	d := min(int64(actual), add(add(l.capacity, l.maxDebt), int64(reserved))) - int64(reserved)
	sk := keyOf(key, limit)
	e, live := m.states[sk]
	if live && now >= e.expires {
		delete(m.states, sk)
		live = false
	}
	var next state
	if d > 0 || d < 0 && live {
		old := e.st
		if !live {
			old = nil
		}
		next = settle(old, limit.Algorithm, l, now, at, d)
	}
	if next == nil {
		r, err := m.AllowN(key, limit, 0, now)
		return r, false, err
	}
	checkExact(next, limit.Algorithm, l)
	// Written, then looked at: the look is what the settle reports, and the
	// state is kept until it is full again.
	m.states[sk] = entry{next, now + 1}
	r, err := m.AllowN(key, limit, 0, now)
	if reset := int64(r.ResetAfter / time.Microsecond); reset > 0 {
		m.states[sk] = entry{next, add(now, reset)}
	} else {
		delete(m.states, sk) // full: it expires now
	}
	return r, true, err
}

// settle returns s corrected by d, or nil when the correction changes
// nothing (a refund that does not find the reservation's window or
// entries).
func settle(s state, alg tollgate.Algorithm, l lim, now, at, d int64) state {
	switch alg {
	case tollgate.TokenBucket:
		tokens, ts := tokensAt(asBucket(s), l, now)
		if d < 0 {
			tokens = ratMin(ratSub(tokens, ratInt(d)), ratInt(l.burst))
		} else {
			tokens = ratMin(tokens, ratMax(ratSub(tokens, ratInt(d)), ratInt(-l.maxDebt)))
		}
		return &bucketState{amount: tokens, ts: ts, unit: l.unit()}
	case tollgate.LeakyBucket:
		level, ts := levelAt(asBucket(s), l, now)
		if d < 0 {
			level = ratMax(ratAdd(level, ratInt(d)), ratInt(0))
		} else {
			// Up to Capacity + MaxDebt, and no further than a read would
			// cap it (see levelAt).
			most := ratMin(ratInt(add(l.capacity, l.maxDebt)), l.drainable())
			level = ratMax(level, ratMin(ratAdd(level, ratInt(d)), most))
		}
		return &bucketState{amount: level, ts: ts, unit: l.unit()}
	case tollgate.GCRA:
		interval := ratFrac(l.period, l.rate)
		tat := tatAt(asGCRA(s), l, now)
		if d < 0 {
			tat = ratMax(ratAdd(tat, ratMul(ratInt(d), interval)), ratInt(now))
		} else {
			most := ratAdd(ratInt(now), ratMul(ratInt(add(l.burst, l.maxDebt)), interval))
			tat = ratMax(tat, ratMin(ratAdd(tat, ratMul(ratInt(d), interval)), most))
		}
		return &gcraState{tat: tat}
	case tollgate.FixedWindow:
		return settleFixed(asWindow(s), l, now, at, d)
	case tollgate.SlidingWindowCounter:
		return settleCounter(asWindow(s), l, now, at, d)
	default:
		return settleLog(asLog(s), l, now, at, d)
	}
}

func settleFixed(s *windowState, l lim, now, at, d int64) state {
	if d < 0 {
		if s.index != floorDiv(at, l.period) {
			return nil
		}
		return &windowState{index: s.index, cur: max(s.cur+d, 0)}
	}
	index, count := floorDiv(now, l.period), int64(0)
	if s != nil && s.index >= index { // a newer window: the clock stepped back
		index, count = s.index, s.cur
	}
	return &windowState{index: index, cur: max(count, min(add(count, d), add(l.rate, l.maxDebt)))}
}

func settleCounter(s *windowState, l lim, now, at, d int64) state {
	if d < 0 {
		switch w := floorDiv(at, l.period); s.index {
		case w:
			return &windowState{index: s.index, cur: max(s.cur+d, 0), prev: s.prev}
		case w + 1:
			return &windowState{index: s.index, cur: s.cur, prev: max(s.prev+d, 0)}
		}
		return nil
	}
	index := floorDiv(now, l.period)
	var cur, prev int64
	if s != nil {
		switch {
		case s.index >= index:
			index, cur, prev = s.index, s.cur, s.prev
		case s.index == index-1:
			prev = s.cur
		}
	}
	return &windowState{index: index, cur: max(cur, min(add(cur, d), add(l.rate, l.maxDebt))), prev: prev}
}

func settleLog(s *logState, l lim, now, at, d int64) state {
	var runs []run
	if s != nil {
		runs = s.runs
	}
	if d < 0 {
		for i, r := range runs {
			if r.at != at {
				continue
			}
			kept := append([]run(nil), runs[:i]...)
			if left := r.count + d; left > 0 {
				kept = append(kept, run{at, left})
			}
			return &logState{runs: append(kept, runs[i+1:]...)}
		}
		return nil
	}
	t := now
	if len(runs) > 0 {
		t = max(t, runs[len(runs)-1].at)
	}
	var kept []run
	var count int64
	for _, r := range runs {
		if r.at > t-l.period {
			kept = append(kept, r)
			count = add(count, r.count)
		}
	}
	if more := min(d, add(l.rate, l.maxDebt)-count); more > 0 {
		if len(kept) > 0 && kept[len(kept)-1].at == t {
			kept[len(kept)-1].count += more
		} else {
			kept = append(kept, run{t, more})
		}
	}
	return &logState{runs: kept}
}

// checkExact panics if a state a settle wrote would not be counted exactly
// in a double by a store: a bucket's tokens, what it lacks to be full, and
// a leaky bucket's level, in parts of a token, below 2^53; GCRA's arrival
// time at most 2^53 µs; a sliding counter's counts, times the steps it
// weighs them in, at most 2^53/4 each.
func checkExact(s state, alg tollgate.Algorithm, l lim) {
	const max53 = 1 << 53
	switch st := s.(type) {
	case *bucketState:
		v := ratMax(st.amount, ratSub(ratInt(l.burst), st.amount))
		if v = ratMul(v, new(big.Rat).SetInt(st.unit)); v.Cmp(ratInt(max53)) >= 0 {
			panic("model: a settle wrote a bucket of " + v.FloatString(0) + " parts, beyond 2^53")
		}
	case *gcraState:
		if st.tat.Cmp(ratInt(max53)) > 0 {
			panic("model: a settle wrote an arrival time beyond 2^53 µs")
		}
	case *windowState:
		if alg != tollgate.SlidingWindowCounter {
			return
		}
		steps := l.period / grain(l.period)
		if max(st.cur, st.prev) > max53/4/steps {
			panic("model: a settle wrote a sliding counter beyond 2^53/4 in steps")
		}
	}
}
