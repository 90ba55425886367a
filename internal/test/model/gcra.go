package model

import "math/big"

// gcraState is the theoretical arrival time, in µs since the epoch: when
// the key would be back to zero if nothing more arrived.
type gcraState struct{ tat *big.Rat }

func (*gcraState) isState() {}

func asGCRA(s state) *gcraState {
	g, _ := s.(*gcraState)
	return g
}

// gcra: the emission interval is exactly Period/Rate µs (a rational) and
// the tolerance Burst intervals. A request of cost n moves the arrival
// time n intervals later and is admitted if it then lies within the
// tolerance of now. An arrival time in the past counts as now.
func gcra(s *gcraState, l lim, now, n int64) (outcome, state) {
	interval := ratFrac(l.period, l.rate)
	tolerance := ratMul(ratInt(l.burst), interval)
	nowR := ratInt(now)
	tat := tatAt(s, l, now)
	next := ratAdd(tat, ratMul(ratInt(n), interval))
	var o outcome
	var written state
	switch {
	case n == 0:
		o.allowed = true
	case ratSub(next, nowR).Cmp(tolerance) <= 0:
		o.allowed = true
		tat = next
		written = &gcraState{tat: tat}
	default:
		// Admitted from the instant next − tolerance: before it, the
		// arrival time stands where it is, and n ≤ Burst fits after it.
		o.retry = ceilRat(ratSub(ratSub(next, tolerance), nowR))
	}
	ahead := ratSub(tat, nowR) // how far the key is spent ahead of now
	// None remains when ahead is past the tolerance: after a far step back
	// of the clock, what is missing is far below any int64.
	if room := ratSub(tolerance, ahead); room.Sign() > 0 {
		o.remaining = floorRat(ratMul(room, ratFrac(l.rate, l.period)))
	}
	o.reset = ceilRat(ahead)
	return o, written
}

// tatAt returns the arrival time a decision at now uses: the stored one,
// kept in units of 1/v µs (v the denominator of the interval in lowest
// terms; a changed rate rounds it up to the new unit), or now if that is
// later.
func tatAt(s *gcraState, l lim, now int64) *big.Rat {
	nowR := ratInt(now)
	if s == nil {
		return nowR
	}
	interval := ratFrac(l.period, l.rate)
	return ratMax(roundUp(s.tat, new(big.Int).Set(interval.Denom())), nowR)
}
