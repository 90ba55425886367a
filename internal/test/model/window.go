package model

// windowState is a window algorithm's state: the index of the key's newest
// window (start = index × Period, windows aligned to the Unix epoch), the
// count admitted in it, and (sliding counter) the count of the window
// before it.
type windowState struct {
	index, cur, prev int64
}

func (*windowState) isState() {}

func asWindow(s state) *windowState {
	w, _ := s.(*windowState)
	return w
}

// fixedWindow admits Rate per window of Period.
func fixedWindow(s *windowState, l lim, now, n int64) (outcome, state) {
	index, count := floorDiv(now, l.period), int64(0)
	if s != nil && s.index >= index { // a newer window: the clock stepped back
		index, count = s.index, s.cur
	}
	end := mul(index+1, l.period)
	var o outcome
	var next state
	switch {
	case n == 0:
		o.allowed = true
	case add(count, n) <= l.rate:
		o.allowed = true
		count += n
		next = &windowState{index: index, cur: count}
	default:
		o.retry = end - now // the next window starts empty
	}
	o.remaining = max(l.rate-count, 0)
	if count > 0 {
		o.reset = end - now
	}
	return o, next
}

// grain is the step, in µs, at which the sliding window counter weighs the
// previous window: 1 ms for periods of at least a second that are whole
// milliseconds, 1 µs otherwise.
func grain(period int64) int64 {
	if period >= 1_000_000 && period%1000 == 0 {
		return 1000
	}
	return 1
}

// slidingWindowCounter estimates the requests in the sliding window of
// Period ending now as the current window's count plus the previous
// window's count weighed by the share of the previous window the sliding
// window still covers, that share counted in whole grains:
// prev × (steps − step)/steps, steps = Period/grain, step = the grains
// elapsed in the current window. A request is admitted if the estimate plus
// its cost is at most Rate.
func slidingWindowCounter(s *windowState, l lim, now, n int64) (outcome, state) {
	index := floorDiv(now, l.period)
	var cur, prev int64
	if s != nil {
		switch {
		case s.index >= index: // the same window, or a newer one
			index, cur, prev = s.index, s.cur, s.prev
		case s.index == index-1:
			prev = s.cur
		}
	}
	g := grain(l.period)
	steps := l.period / g
	start := mul(index, l.period)
	step := (max(now, start) - start) / g
	// fits reports whether a cost c fits with counts (cur, prev) at step k:
	// prev×(steps−k) + (cur+c)×steps ≤ Rate×steps, all exact in int64.
	fits := func(cur, prev, k, c int64) bool {
		return add(mul(prev, steps-k), mul(add(cur, c), steps)) <= mul(l.rate, steps)
	}
	var o outcome
	var next state
	switch {
	case n == 0:
		o.allowed = true
	case fits(cur, prev, step, n):
		o.allowed = true
		cur += n
		next = &windowState{index: index, cur: cur, prev: prev}
	default:
		o.retry = slidingRetry(fits, cur, prev, start, steps, g, l.period, n) - now
	}
	// Remaining: the largest c that fits now.
	room := mul(l.rate, steps) - mul(prev, steps-step) - mul(cur, steps)
	o.remaining = max(floorDiv(room, steps), 0)
	switch {
	case cur > 0:
		o.reset = mul(index+2, l.period) - now
	case prev > 0:
		o.reset = mul(index+1, l.period) - now
	}
	return o, next
}

// slidingRetry returns the first instant at which a cost n fits: a step of
// the current window (the previous window weighs less as it passes), or a
// step of the next one, where the current count becomes the previous one.
// fits is monotone in the step, so the first step is found by bisection.
func slidingRetry(fits func(cur, prev, k, c int64) bool, cur, prev, start, steps, g, period, n int64) int64 {
	first := func(cur, prev int64) (int64, bool) {
		if !fits(cur, prev, steps-1, n) {
			return 0, false
		}
		lo, hi := int64(0), steps-1 // the answer is in [lo, hi]
		for lo < hi {
			mid := lo + (hi-lo)/2
			if fits(cur, prev, mid, n) {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		return lo, true
	}
	if k, ok := first(cur, prev); ok {
		return start + k*g
	}
	if k, ok := first(0, cur); ok {
		return start + period + k*g
	}
	return start + 2*period // both windows gone: it always fits
}
