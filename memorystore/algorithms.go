package memorystore

import (
	"math/bits"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/store/exact"
)

// This file is the Go twin of redisstore/lua/*.lua: the same integer
// arithmetic, step for step, so that a key decides identically in memory and
// in Redis (internal/test/conformance proves it). Read a script's header for the
// reasoning; the comments here note only where Go differs in form.
//
// Times are µs since the Unix epoch, tokens are fixed-point units (Params.Unit
// units = one token). A decision that denies, or that spends nothing, leaves
// the state as it was — as the scripts, which write nothing then.

// state is one key's state. The fields mean what the algorithm says:
//
//	token bucket:           a tokens (units), b last update (µs), c units per token
//	leaky bucket:           a level (units),  b last update (µs), c units per token
//	GCRA:                   a theoretical arrival time: a µs, b fraction, c fraction units per µs
//	fixed window:           a window index, b count
//	sliding window counter: a window index, b current count, c previous count
//	sliding window log:     a the index + 1 of its log in the shard's logs
//	                        (the store's, not the algorithm's), log the
//	                        admitted times
type state struct {
	a, b, c int64
	// expires is when the state is back to full under the limit of the
	// last call that set it (µs): from then on it decides like a fresh key
	// under any limit, so it may be reclaimed. 0 for none.
	expires int64
}

// decision is what one call decides, in µs.
type decision struct {
	allowed                        bool
	write                          bool // the state changed: refresh expires
	remaining, retry, reset, delay int64
}

// decideOn makes one decision on s (and log, a sliding window log's) into
// d, which starts zero. The decision is written in place, not returned:
// copying it back through the frames between the algorithm and the caller
// was a tenth of a decision's instructions.
func decideOn(d *decision, s *state, log *ring, fresh bool, p *tollgate.Params, now, n int64) {
	switch p.Algorithm {
	case tollgate.GCRA:
		gcra(d, s, fresh, p, now, n)
	case tollgate.FixedWindow:
		fixedWindow(d, s, fresh, p, now, n)
	case tollgate.SlidingWindowLog:
		slidingWindowLog(d, log, fresh, p, now, n)
	case tollgate.SlidingWindowCounter:
		slidingWindowCounter(d, s, fresh, p, now, n)
	case tollgate.LeakyBucket:
		leakyBucket(d, s, fresh, p, now, n)
	default:
		tokenBucket(d, s, fresh, p, now, n)
	}
}

func tokenBucket(d *decision, s *state, fresh bool, p *tollgate.Params, now, n int64) {
	capacity := p.Burst * p.Unit
	tokens, ts := tokensAt(s, fresh, p, now)
	lag := ts - now // > 0 only when the clock went backwards
	cost := n * p.Unit
	d.allowed = n == 0 || tokens >= cost // a look is allowed, also in debt
	switch {
	case !d.allowed:
		d.retry = lag + exact.CeilDiv(cost-tokens, p.UnitRate)
	case n > 0:
		tokens -= cost
		s.a, s.b, s.c = tokens, ts, p.Unit
		d.write = true
	}
	d.remaining = max(tokens, 0) / p.Unit // a debt leaves none
	if tokens < capacity {
		d.reset = lag + exact.CeilDiv(capacity-tokens, p.UnitRate)
	}
}

// tokensAt returns a token bucket's tokens (units) and its time, brought
// to now as every decision and settle does. Tokens below zero are a debt a
// settle charged: a changed rate converts it rounding down too (the debt
// grows by less than a unit), and it is never more than this limit's
// MaxDebt, which keeps capacity − tokens below 2^53.
func tokensAt(s *state, fresh bool, p *tollgate.Params, now int64) (tokens, ts int64) {
	capacity := p.Burst * p.Unit
	if fresh {
		return capacity, now
	}
	tokens, ts = s.a, s.b
	if s.c != p.Unit { // the rate changed: convert exactly, rounding down
		if tokens >= 0 {
			tokens = exact.MulDiv(tokens, p.Unit, s.c, capacity)
		} else {
			tokens = -exact.MulDivUp(-tokens, p.Unit, s.c, p.MaxDebt*p.Unit)
		}
	}
	tokens = min(max(tokens, -p.MaxDebt*p.Unit), capacity)
	if now > ts {
		// Full when now-ts ≥ ⌈(capacity − tokens) / UnitRate⌉, as the
		// script asks, which for integers is (now-ts) × UnitRate ≥
		// capacity − tokens: the product in 128 bits, exact, instead of
		// a division on every decision.
		hi, lo := bits.Mul64(uint64(now-ts), uint64(p.UnitRate))
		if hi > 0 || lo >= uint64(capacity-tokens) {
			tokens = capacity
		} else {
			tokens += int64(lo)
		}
		ts = now
	}
	return tokens, ts
}

func leakyBucket(d *decision, s *state, fresh bool, p *tollgate.Params, now, n int64) {
	capacity := p.Burst * p.Unit
	level, ts := levelAt(s, fresh, p, now)
	lag := ts - now
	cost := n * p.Unit
	over := level + cost - capacity
	switch {
	case n == 0 || over <= 0:
		d.allowed = true
	default:
		// A shaper's delay is the one checked against MaxDelay, lag included.
		wait := lag + exact.CeilDiv(over, p.UnitRate)
		if wait <= p.MaxDelayUS {
			d.allowed = true
			d.delay = wait
		} else {
			d.retry = wait - p.MaxDelayUS
		}
	}
	if d.allowed && n > 0 {
		level += cost
		s.a, s.b, s.c = level, ts, p.Unit
		d.write = true
	}
	d.remaining = max(capacity-level, 0) / p.Unit
	if level > 0 {
		d.reset = lag + exact.CeilDiv(level, p.UnitRate)
	}
}

// levelAt returns a leaky bucket's level (units) and its time, brought to
// now as every decision and settle does.
func levelAt(s *state, fresh bool, p *tollgate.Params, now int64) (level, ts int64) {
	if fresh {
		return 0, now
	}
	level, ts = s.a, s.b
	if s.c != p.Unit {
		// The rate changed: convert exactly, rounding down, and clamp to
		// the most the bucket can hold, Burst and what MaxDelay queues (a
		// level of 10^9 draining at 1 a day would outlast any duration).
		// A debt a settle charged beyond that is forgiven.
		level = exact.MulDiv(level, p.Unit, s.c, p.Burst*p.Unit+p.MaxDelayUS*p.UnitRate)
	}
	level = min(level, drainable(p))
	if now > ts {
		if now-ts >= exact.CeilDiv(level, p.UnitRate) {
			level = 0
		} else {
			level -= (now - ts) * p.UnitRate
		}
		ts = now
	}
	return level, ts
}

// maxDrainUS is the longest a leaky bucket's level may take to drain as a
// limit reads it: twice the longest period or maximum delay, so no level
// a limit's own admissions leave is above it, while a level another rate of the
// same unit left (997 and 1 per a period 997 does not divide) may drain in
// centuries. With the lag of a clock that stepped back from exact.MaxNow,
// every duration stays within 2^53 µs.
const maxDrainUS = 2 * exact.MaxHorizon

// drainable returns the units that drain in maxDrainUS under p, or
// exact.Max when that is more (every level is below it).
func drainable(p *tollgate.Params) int64 {
	if p.UnitRate >= exact.Max/maxDrainUS {
		return exact.Max
	}
	return maxDrainUS * p.UnitRate
}

func gcra(d *decision, s *state, fresh bool, p *tollgate.Params, now, n int64) {
	rate, unit := p.UnitRate, p.Unit
	tat, frac := tatAt(s, fresh, p, now) // the TAT is tat + frac/rate µs
	ahead := tat - now
	room := (p.Burst-n)*unit - frac
	d.allowed = n == 0 || (room >= 0 && ahead <= room/rate)
	switch {
	case !d.allowed:
		if x := -room; x >= 0 {
			d.retry = ahead + exact.CeilDiv(x, rate)
		} else {
			d.retry = ahead - room/rate
		}
	case n > 0:
		step := n * unit
		whole, part := step/rate, step%rate
		tat += whole
		if frac >= rate-part {
			tat, frac = tat+1, frac-(rate-part)
		} else {
			frac += part
		}
		ahead = tat - now
		s.a, s.b, s.c = tat, frac, rate
		d.write = true
	}
	d.reset = ahead
	if frac > 0 {
		d.reset++
	}
	if full := p.Burst*unit - frac; full >= 0 && ahead <= full/rate {
		d.remaining = (full - ahead*rate) / unit
	}
}

// tatAt returns GCRA's theoretical arrival time as every decision and
// settle uses it: whole µs and a fraction in units of 1/UnitRate µs, at
// least now.
func tatAt(s *state, fresh bool, p *tollgate.Params, now int64) (tat, frac int64) {
	if fresh {
		return now, 0
	}
	rate := p.UnitRate
	t, f := s.a, s.b
	if s.c != rate { // the rate changed: convert exactly, rounding up
		if f = exact.MulDivUp(f, rate, s.c, rate); f == rate {
			t, f = t+1, 0
		}
	}
	if t < now {
		return now, 0
	}
	return t, f
}

func fixedWindow(d *decision, s *state, fresh bool, p *tollgate.Params, now, n int64) {
	if p.Calendar != nil {
		calendarFixedWindow(d, s, fresh, p, now, n)
		return
	}
	window := now / p.PeriodUS
	count := int64(0)
	if !fresh && s.a >= window { // s.a > window: the clock went back; stay
		window, count = s.a, s.b
	}
	end := (window + 1) * p.PeriodUS
	d.allowed = n == 0 || count+n <= p.Rate
	switch {
	case !d.allowed:
		d.retry = end - now
	case n > 0:
		count += n
		s.a, s.b = window, count
		d.write = true
	}
	d.remaining = max(p.Rate-count, 0)
	if count > 0 {
		d.reset = end - now
	}
}

func slidingWindowCounter(d *decision, s *state, fresh bool, p *tollgate.Params, now, n int64) {
	if p.Calendar != nil {
		calendarSlidingWindowCounter(d, s, fresh, p, now, n)
		return
	}
	period := p.PeriodUS
	window := now / period
	cur, prev := int64(0), int64(0)
	if !fresh {
		switch {
		case s.a >= window:
			window, cur, prev = s.a, s.b, s.c
		case s.a == window-1:
			prev = s.b
		}
	}
	start := window * period
	grain := exact.SlidingGrain(period)
	steps := period / grain
	step := (max(now, start) - start) / grain
	weighted := prev * (steps - step)
	d.allowed = n == 0 || weighted+(cur+n)*steps <= p.Rate*steps
	switch {
	case !d.allowed:
		var at int64 // the first instant the same request fits
		if cur+n <= p.Rate {
			// Later in this window, once the previous one weighs little enough.
			if k := steps - (p.Rate-cur-n)*steps/prev; k < steps {
				at = start + k*grain
			}
		}
		if at == 0 {
			// In the next window, where this window's count fades instead.
			// k is below 0 when this window's count alone leaves room at
			// the next window's start: the request fits there.
			k := int64(0)
			if cur > 0 {
				k = max(steps-(p.Rate-n)*steps/cur, 0)
			}
			at = start + period + k*grain
		}
		d.retry = at - now
	case n > 0:
		cur += n
		s.a, s.b, s.c = window, cur, prev
		d.write = true
	}
	d.remaining = max(p.Rate*steps-weighted-cur*steps, 0) / steps
	switch {
	case cur > 0:
		d.reset = start + 2*period - now
	case prev > 0:
		d.reset = start + period - now
	}
}

// calendarFixedWindow is fixedWindow in calendar windows (Limit.Calendar),
// as lua/calendar.lua decides it: the state is the window's start (a), its
// count (b) and its end (c), so that a clock that stepped back stays in
// the newer window with that window's own end.
func calendarFixedWindow(d *decision, s *state, fresh bool, p *tollgate.Params, now, n int64) {
	w, _ := p.Calendar.Window(now) // decideAt checked it
	start, end, count := w.Start, w.End, int64(0)
	if !fresh && s.a >= start {
		start, count, end = s.a, s.b, s.c
	}
	d.allowed = n == 0 || count+n <= p.Rate
	switch {
	case !d.allowed:
		d.retry = end - now
	case n > 0:
		count += n
		s.a, s.b, s.c = start, count, end
		d.write = true
	}
	d.remaining = max(p.Rate-count, 0)
	if count > 0 {
		d.reset = end - now
	}
}

// calendarSlidingWindowCounter is slidingWindowCounter in calendar windows,
// of unequal lengths, as lua/calendar.lua decides it: at t in the window
// [start, end) the previous window's count weighs (steps − step)/steps,
// steps the window's whole seconds, step those elapsed. The state is the
// window's start (a) and the two counts (b, c); the window's edges come
// from its start.
func calendarSlidingWindowCounter(d *decision, s *state, fresh bool, p *tollgate.Params, now, n int64) {
	w, _ := p.Calendar.Window(now) // decideAt checked it
	cur, prev := int64(0), int64(0)
	if !fresh {
		switch {
		case s.a > w.Start: // a newer window: the clock stepped back
			w, _ = p.Calendar.Window(s.a)
			cur, prev = s.b, s.c
		case s.a == w.Start:
			cur, prev = s.b, s.c
		case s.a == w.Prev:
			prev = s.b
		}
	}
	const grain = exact.CalendarGrain
	start, end := w.Start, w.End
	steps := (end - start) / grain
	step := (max(now, start) - start) / grain
	weighted := prev * (steps - step)
	d.allowed = n == 0 || weighted+(cur+n)*steps <= p.Rate*steps
	switch {
	case !d.allowed:
		var at int64
		if cur+n <= p.Rate {
			if k := steps - (p.Rate-cur-n)*steps/prev; k < steps {
				at = start + k*grain
			}
		}
		if at == 0 {
			// In the next window, of its own length, where this
			// window's count is the one that fades.
			next := (w.Next - end) / grain
			k := int64(0)
			if cur > 0 {
				k = max(next-(p.Rate-n)*next/cur, 0)
			}
			at = end + k*grain
		}
		d.retry = at - now
	case n > 0:
		cur += n
		s.a, s.b, s.c = start, cur, prev
		d.write = true
	}
	d.remaining = max(p.Rate*steps-weighted-cur*steps, 0) / steps
	switch {
	case cur > 0:
		d.reset = w.Next - now
	case prev > 0:
		d.reset = end - now
	}
}

func slidingWindowLog(d *decision, log *ring, fresh bool, p *tollgate.Params, now, n int64) {
	if fresh { // an expired log: keep its buffer, not its entries
		log.head, log.n = 0, 0
	}
	at := now
	if log.len() > 0 && log.newest() > now {
		at = log.newest()
	}
	// Count the entries in (at − period, at] without dropping the older
	// ones: only an admission moves the key's time to at for good, so only
	// then can they never count again (a call that spends nothing, the
	// clock back behind at, would count them).
	first := log.search(at - p.PeriodUS)
	count := int64(log.len() - first)
	d.allowed = n == 0 || count+n <= p.Rate
	switch {
	case !d.allowed:
		// The oldest count+n-Rate entries must leave the window first.
		d.retry = log.at(first+int(count+n-p.Rate-1)) + p.PeriodUS - now
	case n > 0:
		for range first {
			log.pop()
		}
		log.push(at, int(n), int(p.Rate))
		count += n
		d.write = true
	}
	d.remaining = max(p.Rate-count, 0)
	if count > 0 {
		d.reset = log.newest() + p.PeriodUS - now
	}
}

// ring is a FIFO of admitted times, oldest first. It grows by doubling up to
// the limit's rate and is reused after that: a key that keeps its limit
// allocates nothing per decision.
type ring struct {
	buf  []int64
	head int
	n    int
}

func (r *ring) len() int       { return r.n }
func (r *ring) at(i int) int64 { return r.buf[(r.head+i)%len(r.buf)] }
func (r *ring) newest() int64  { return r.at(r.n - 1) }
func (r *ring) pop()           { r.head = (r.head + 1) % len(r.buf); r.n-- }
func (r *ring) bytes() int     { return 8 * cap(r.buf) }

// search returns how many entries are at or before t: the index of the
// first one after it.
func (r *ring) search(t int64) int {
	lo, hi := 0, r.n
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if r.at(mid) <= t {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}
func (r *ring) push(t int64, k, limit int) {
	if r.n+k > len(r.buf) {
		size := max(2*len(r.buf), r.n+k, 4)
		size = min(size, max(limit, r.n+k))
		buf := make([]int64, size)
		for i := 0; i < r.n; i++ {
			buf[i] = r.at(i)
		}
		r.buf, r.head = buf, 0
	}
	for i := 0; i < k; i++ {
		r.buf[(r.head+r.n)%len(r.buf)] = t
		r.n++
	}
}
