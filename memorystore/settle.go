package memorystore

import (
	"github.com/tollgate/tollgate"
)

// The settle corrections, the Go twin of what the Lua scripts do for
// redisstore's SettleN. Each one corrects s (and log) by d, the bounded
// actual − reserved of tollgate.CheckSettle (d ≠ 0), for a reservation
// admitted at the store's clock at, and reports whether it wrote: a write
// keeps the state until it is full again, as an admission does; a refund
// that finds nothing to give back writes nothing, and the settle is a look.
//
// A charge never lowers what a key has spent: its cap (the key's MaxDebt
// under this limit) may lie below what a lowered limit left, and a charge
// that lowered it would be a refund. A refund never raises it.

// settleOn corrects s (log, a sliding window log's) by d. fresh reports
// that the key holds no live state; a refund then does nothing.
func settleOn(s *state, log *ring, fresh bool, p *tollgate.Params, now, at, d int64) bool {
	if fresh && d < 0 {
		return false
	}
	switch p.Algorithm {
	case tollgate.GCRA:
		settleGCRA(s, fresh, p, now, d)
	case tollgate.FixedWindow:
		return settleFixedWindow(s, fresh, p, now, at, d)
	case tollgate.SlidingWindowLog:
		return settleSlidingWindowLog(log, fresh, p, now, at, d)
	case tollgate.SlidingWindowCounter:
		return settleSlidingWindowCounter(s, fresh, p, now, at, d)
	case tollgate.LeakyBucket:
		settleLeakyBucket(s, fresh, p, now, d)
	default:
		settleTokenBucket(s, fresh, p, now, d)
	}
	return true
}

// settleTokenBucket gives tokens back up to a full bucket, or takes them
// down to −MaxDebt: the debt the next requests wait out.
func settleTokenBucket(s *state, fresh bool, p *tollgate.Params, now, d int64) {
	tokens, ts := tokensAt(s, fresh, p, now)
	if d < 0 {
		tokens = min(tokens-d*p.Unit, p.Burst*p.Unit)
	} else {
		tokens = min(tokens, max(tokens-d*p.Unit, -p.MaxDebt*p.Unit))
	}
	s.a, s.b, s.c = tokens, ts, p.Unit
}

// settleLeakyBucket drains the level by a refund, down to empty, and
// fills it by a charge up to Capacity + MaxDebt, and no further than a read
// caps it (drainable).
func settleLeakyBucket(s *state, fresh bool, p *tollgate.Params, now, d int64) {
	level, ts := levelAt(s, fresh, p, now)
	if d < 0 {
		level = max(level+d*p.Unit, 0)
	} else {
		level = max(level, min(level+d*p.Unit, (p.Capacity+p.MaxDebt)*p.Unit, drainable(p)))
	}
	s.a, s.b, s.c = level, ts, p.Unit
}

// settleGCRA moves the theoretical arrival time back by a refund's
// intervals, never before now, or later by a charge's, never beyond
// (Burst + MaxDebt) intervals after now. Times are whole µs and a fraction
// of UnitRate units; an interval is Unit of those.
func settleGCRA(s *state, fresh bool, p *tollgate.Params, now, d int64) {
	rate := p.UnitRate
	tat, frac := tatAt(s, fresh, p, now)
	if d < 0 {
		step := -d * p.Unit
		tat -= step / rate
		if part := step % rate; frac >= part {
			frac -= part
		} else {
			tat, frac = tat-1, frac+rate-part
		}
		if tat < now {
			tat, frac = now, 0
		}
	} else {
		t, f := addIntervals(tat, frac, d*p.Unit, rate)
		ct, cf := addIntervals(now, 0, (p.Burst+p.MaxDebt)*p.Unit, rate)
		if t > ct || t == ct && f > cf {
			t, f = ct, cf
		}
		if t > tat || t == tat && f > frac { // never earlier than it was
			tat, frac = t, f
		}
	}
	s.a, s.b, s.c = tat, frac, rate
}

// addIntervals returns the time tat + frac/rate µs plus step/rate µs, as
// whole µs and a fraction.
func addIntervals(tat, frac, step, rate int64) (int64, int64) {
	tat += step / rate
	if part := step % rate; frac >= rate-part {
		return tat + 1, frac - (rate - part)
	}
	return tat, frac + step%rate
}

// settleFixedWindow refunds to the reservation's window while the key is
// still in it, and charges in the window a decision at now counts in.
func settleFixedWindow(s *state, fresh bool, p *tollgate.Params, now, at, d int64) bool {
	if d < 0 {
		if s.a != at/p.PeriodUS {
			return false
		}
		s.b = max(s.b+d, 0)
		return true
	}
	window, count := now/p.PeriodUS, int64(0)
	if !fresh && s.a >= window { // a newer window: the clock went back; stay
		window, count = s.a, s.b
	}
	s.a, s.b = window, max(count, min(count+d, p.Rate+p.MaxDebt))
	return true
}

// settleSlidingWindowCounter refunds to the reservation's window while it
// is the key's current or previous one, and charges in the window a
// decision at now counts in, the windows rolled as it rolls them.
func settleSlidingWindowCounter(s *state, fresh bool, p *tollgate.Params, now, at, d int64) bool {
	if d < 0 {
		switch w := at / p.PeriodUS; s.a {
		case w:
			s.b = max(s.b+d, 0)
		case w + 1:
			s.c = max(s.c+d, 0)
		default:
			return false
		}
		return true
	}
	window := now / p.PeriodUS
	cur, prev := int64(0), int64(0)
	if !fresh {
		switch {
		case s.a >= window:
			window, cur, prev = s.a, s.b, s.c
		case s.a == window-1:
			prev = s.b
		}
	}
	s.a, s.b, s.c = window, max(cur, min(cur+d, p.Rate+p.MaxDebt)), prev
	return true
}

// settleSlidingWindowLog removes up to −d of the reservation's own entries
// (those at its instant) for a refund; for a charge it drops the entries a
// decision at now would drop and adds d at the instant it would record,
// up to Rate + MaxDebt entries in the log.
func settleSlidingWindowLog(log *ring, fresh bool, p *tollgate.Params, now, at, d int64) bool {
	if d < 0 {
		return log.remove(at, int(-d)) > 0
	}
	if fresh {
		log.head, log.n = 0, 0
	}
	t := now
	if log.len() > 0 && log.newest() > now {
		t = log.newest()
	}
	for range log.search(t - p.PeriodUS) {
		log.pop()
	}
	most := p.Rate + p.MaxDebt
	log.push(t, int(max(0, min(d, most-int64(log.len())))), int(most))
	return true
}

// remove takes out up to k entries at time t, and returns how many it took.
func (r *ring) remove(t int64, k int) int {
	lo, hi := r.search(t-1), r.search(t) // the entries at t are [lo, hi)
	m := min(k, hi-lo)
	if m == 0 {
		return 0
	}
	for i := hi; i < r.n; i++ {
		r.buf[(r.head+i-m)%len(r.buf)] = r.at(i)
	}
	r.n -= m
	return m
}
