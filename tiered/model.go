package tiered

import (
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/store/exact"
)

// seen is what the global store answered for a key: enough to tell, later,
// whether a request would certainly be denied and with which Result. It is
// derived only from the Result (the scripts are not changed for it) and
// the time elapsed since the global call was sent.
type seen struct {
	limit tollgate.Limit
	n     int // the cost the global store decided
	res   tollgate.Result
	at    time.Time // local time the global call was sent
	until time.Time // after this the entry can deny nothing more
}

// The elapsed time is counted from when the global call was sent, not from
// when its answer came back: the global store decided somewhere in
// between, so the model assumes at least as much refill as there really
// was. A local denial is therefore always one the global store would also
// give at that moment (other instances can only have spent more, on the
// premise the package doc states: nothing refunds); the cost
// is that a local RetryAfter may be short by up to one round trip.

// remember returns what to keep from a global decision of cost n under
// limit, and whether it is worth keeping: a denial, or an admission that
// left less than n, after which the next request of the same cost is
// denied. Everything else would deny nothing.
func remember(p *tollgate.Params, limit tollgate.Limit, n int, res tollgate.Result, at time.Time) (seen, bool) {
	if n < 1 || (res.Allowed && res.Remaining >= n) {
		return seen{}, false
	}
	e := seen{limit: limit, n: n, res: res, at: at}
	switch p.Algorithm {
	case tollgate.TokenBucket, tollgate.LeakyBucket, tollgate.GCRA:
		// The state is back to full after ResetAfter: nothing to deny then.
		e.until = at.Add(res.ResetAfter)
	case tollgate.FixedWindow:
		// Denied or not, the window ends after ResetAfter (a window that
		// has admitted anything) or RetryAfter (a denial).
		e.until = at.Add(max(res.ResetAfter, res.RetryAfter))
	default: // the sliding windows: only a denial of cost 1 is exact
		if res.Allowed || n != 1 {
			return seen{}, false
		}
		e.until = at.Add(res.RetryAfter)
	}
	return e, e.until.After(at)
}

// deny returns the Result the global store would give a request of cost m
// at now, if that is certainly a denial; ok is false when the request may
// be admitted (it must then go to the global store) or the entry cannot
// tell.
//
// Per algorithm (all quantities are integers, as in the scripts):
//
//   - TokenBucket, LeakyBucket: the state is a level (spent units, the
//     bucket's deficit) draining at UnitRate per µs. The Result's fields
//     pin it down to a range one µs of drain wide (see levels): a single
//     value when the rate divides the period in µs (UnitRate 1: every "N
//     per second" with N dividing 10^6, and so on). A request is answered
//     locally only when every level in the range gives the same denial,
//     so the answer is exact; otherwise it goes to the global store.
//   - GCRA: the theoretical arrival time ahead of now, counted in units of
//     1/UnitRate µs, is the same level: it shrinks by UnitRate a µs, a
//     request of cost n adds n·Unit, and the scripts derive the Result's
//     fields from it with the token bucket's formulas (a clock step back
//     is in the level itself, never a separate lag). So it is answered
//     exactly as the buckets are.
//   - FixedWindow: nothing changes until the window ends except by
//     spending: Remaining stays, the window's end comes closer. Exact.
//   - SlidingWindowLog, SlidingWindowCounter: how much room frees up, and
//     when, depends on entries the Result does not describe; but a denial
//     of cost 1 stays a denial of cost 1 with Remaining 0 until its
//     RetryAfter, and both durations count down. Only that is answered.
func (e *seen) deny(p *tollgate.Params, m int, now time.Time) (tollgate.Result, bool) {
	// Elapsed µs as the stores count them: each instant truncated to a
	// µs, then subtracted (not the difference truncated, which can be a
	// µs shorter on a clock finer than a µs).
	us, left := now.UnixMicro()-e.at.UnixMicro(), e.until.UnixMicro()-now.UnixMicro()
	if us < 0 || left <= 0 {
		return tollgate.Result{}, false
	}
	res := tollgate.Result{Limit: e.limit}
	switch p.Algorithm {
	case tollgate.TokenBucket, tollgate.LeakyBucket, tollgate.GCRA:
		lo, hi, floor, ok := e.levels(p)
		if !ok {
			return res, false
		}
		// Every level in (lo, hi] is consistent with what the global store
		// said; answer only if all of them give the same denial (the
		// answer is monotonic in the level, so the two ends suffice).
		drained := us * p.UnitRate
		a, okA := bucketDenial(p, lo+1-drained, m)
		b, okB := bucketDenial(p, hi-drained, m)
		if !okA || !okB || a != b {
			return res, false
		}
		// And the request must be denied even if the store lags (see
		// levels): then its durations are a's, but it admits by the level
		// alone.
		if _, ok := bucketDenial(p, min(floor+1, lo+1-drained), m); !ok {
			return res, false
		}
		a.Limit = e.limit
		return a, true
	case tollgate.FixedWindow:
		if m <= e.res.Remaining {
			return res, false
		}
		res.Remaining = e.res.Remaining
		res.RetryAfter = time.Duration(left) * time.Microsecond
		res.ResetAfter = res.RetryAfter
	default:
		if m != 1 {
			return res, false
		}
		res.RetryAfter = e.res.RetryAfter - time.Duration(us)*time.Microsecond
		res.ResetAfter = max(e.res.ResetAfter-time.Duration(us)*time.Microsecond, res.RetryAfter)
	}
	return res, true
}

// levels returns the range (lo, hi] of bucket levels (spent units: the
// deficit of a token bucket, the content of a leaky bucket) that agree with
// every field of the remembered Result, as the scripts compute them:
//
//	ResetAfter = lag + ⌈level / rate⌉
//	RetryAfter = lag + ⌈(level + n·unit − capacity − queue) / rate⌉   (a denial)
//	Delay      = lag + ⌈(level − capacity) / rate⌉                    (a delayed admission)
//	Remaining  = ⌊max(capacity − level, 0) / unit⌋
//
// lag is how far the store's state is ahead of its clock: 0 unless the
// clock went backwards. The range assumes it is 0; ok is false when the
// fields contradict that (nothing is then answered locally).
//
// A lag the fields cannot show (every duration shifted by the same amount)
// would make the range too high; floor is what holds whatever the lag: the
// level is above it, by what Remaining, Allowed and Delay say (they do not
// depend on the lag). A lagging store does not drain until its clock
// catches up, so at any later moment the level is at least the smaller of
// floor+1 and the low end of the range drained since.
//
// Levels are counted in int64, which holds any level an admission under
// this limit leaves (below 2^53 units), but not every duration counted in
// units: a GCRA state that a clock step back, or a slower limit, left
// months ahead of the clock is more units than an int64 holds at a high
// rate (5,532,222 per 24h counts a µs as 922,037 units). A Result with a
// duration of more than 2^53 units is not answered locally (ok false).
func (e *seen) levels(p *tollgate.Params) (lo, hi, floor int64, ok bool) {
	if most := exact.Max / p.UnitRate; max(e.res.ResetAfter, e.res.RetryAfter, e.res.Delay) > time.Duration(most)*time.Microsecond {
		return 0, 0, 0, false
	}
	capacity := p.Burst * p.Unit
	queue := p.MaxDelayUS * p.UnitRate
	s := micros(e.res.ResetAfter)
	lo, hi = (s-1)*p.UnitRate, s*p.UnitRate
	r := int64(e.res.Remaining)
	floor = capacity - (r+1)*p.Unit
	if r > 0 {
		hi = min(hi, capacity-r*p.Unit)
	}
	switch {
	case !e.res.Allowed:
		c := capacity + queue - int64(e.n)*p.Unit
		floor = max(floor, c)
		d := micros(e.res.RetryAfter)
		lo, hi = max(lo, (d-1)*p.UnitRate+c), min(hi, d*p.UnitRate+c)
	case e.res.Delay > 0:
		floor = max(floor, capacity)
		d := micros(e.res.Delay)
		lo, hi = max(lo, (d-1)*p.UnitRate+capacity), min(hi, d*p.UnitRate+capacity)
	default:
		hi = min(hi, capacity)
	}
	lo = max(lo, floor)
	return lo, hi, floor, lo < hi
}

// bucketDenial is the Result of a request of cost m on a bucket at level,
// if it is denied; the same arithmetic as the scripts.
func bucketDenial(p *tollgate.Params, level int64, m int) (tollgate.Result, bool) {
	capacity := p.Burst * p.Unit
	queue := p.MaxDelayUS * p.UnitRate
	over := level + int64(m)*p.Unit - capacity - queue
	if level <= 0 || over <= 0 {
		return tollgate.Result{}, false
	}
	return tollgate.Result{
		Remaining:  int(max(capacity-level, 0) / p.Unit),
		RetryAfter: time.Duration(ceilDiv(over, p.UnitRate)) * time.Microsecond,
		ResetAfter: time.Duration(ceilDiv(level, p.UnitRate)) * time.Microsecond,
	}, true
}

func micros(d time.Duration) int64 { return int64(d / time.Microsecond) }

// ceilDiv returns ⌈a/b⌉ for a ≥ 0, b ≥ 1.
func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }
