package model

import "math/big"

// bucketState is a token bucket's tokens or a leaky bucket's level, in
// tokens, at ts (µs): the last time anything was admitted, and the unit
// (parts per token) of the limit that admitted it.
type bucketState struct {
	amount *big.Rat
	ts     int64
	unit   *big.Int
}

func (*bucketState) isState() {}

func asBucket(s state) *bucketState {
	b, _ := s.(*bucketState)
	return b
}

// perUS is the refill (or leak) per µs: Rate/Period tokens.
func (l lim) perUS() *big.Rat { return ratFrac(l.rate, l.period) }

// unit is how many parts a token is counted in: the denominator of
// Rate/Period in lowest terms, period/gcd(rate, period).
func (l lim) unit() *big.Int { return new(big.Int).Set(l.perUS().Denom()) }

// usFor returns ⌈amount / (Rate/Period)⌉: the whole µs it takes to refill
// (or drain) amount tokens.
func (l lim) usFor(amount *big.Rat) int64 {
	return ceilRat(ratMul(amount, ratFrac(l.period, l.rate)))
}

// tokenBucket: the bucket holds up to Burst tokens and gains Rate per
// Period continuously; a request of cost n is admitted if n tokens are
// there, and takes them.
func tokenBucket(s *bucketState, l lim, now, n int64) (outcome, state) {
	capacity := ratInt(l.burst)
	tokens, ts := tokensAt(s, l, now)
	lag := ts - now // > 0 when the clock stepped back: time stands still
	var o outcome
	var next state
	cost := ratInt(n)
	switch {
	case n == 0:
		o.allowed = true
	case tokens.Cmp(cost) >= 0:
		o.allowed = true
		tokens = ratSub(tokens, cost)
		next = &bucketState{amount: tokens, ts: ts, unit: l.unit()}
	default:
		o.retry = add(lag, l.usFor(ratSub(cost, tokens)))
	}
	o.remaining = max(floorRat(tokens), 0) // a debt leaves none
	if tokens.Cmp(capacity) < 0 {
		o.reset = add(lag, l.usFor(ratSub(capacity, tokens)))
	}
	return o, next
}

// tokensAt returns the tokens of a token bucket at now and the bucket's
// time: the stored amount in this limit's unit, rounded down (toward −∞
// for a debt), at most Burst and at least −MaxDebt, refilled for the time
// since ts unless the clock stepped back.
func tokensAt(s *bucketState, l lim, now int64) (*big.Rat, int64) {
	capacity := ratInt(l.burst)
	if s == nil {
		return capacity, now
	}
	tokens, ts := roundDown(s.amount, l.unit()), s.ts
	tokens = ratMax(ratMin(tokens, capacity), ratInt(-l.maxDebt))
	if now > ts {
		elapsed := ratInt(now - ts)
		tokens = ratMin(capacity, ratAdd(tokens, ratMul(elapsed, l.perUS())))
		ts = now
	}
	return tokens, ts
}

// leakyBucket: the bucket fills with what is admitted and drains at Rate
// per Period. A level kept under another rate is converted to this rate's
// unit, rounded down, and clamped to the most this limit can hold: Burst
// plus what MaxDelay queues (a level left by a far higher rate would
// otherwise take longer than any duration can say to drain). A level kept
// under the same unit is kept whole, even above a lowered Burst: it drains
// in the time it always would have. Any level is read as at most what
// drains in maxDrain under this limit: another rate can share the unit
// (997 and 1 per a period 997 does not divide), and a level it left may
// drain in centuries at this one. A request that fits under Burst goes at
// once. A policer (MaxDelay 0) rejects one that overflows; a shaper admits
// it with Delay = the lag plus the time until enough has drained, if that
// is at most MaxDelay, and the level then stands above Burst by what is
// queued.
func leakyBucket(s *bucketState, l lim, now, n int64) (outcome, state) {
	capacity := ratInt(l.burst)
	level, ts := levelAt(s, l, now)
	lag := ts - now
	var o outcome
	var next state
	over := ratSub(ratAdd(level, ratInt(n)), capacity) // tokens above Burst
	switch {
	case n == 0:
		o.allowed = true
	case over.Sign() <= 0:
		o.allowed = true
	default:
		wait := add(lag, l.usFor(over))
		if wait <= l.maxDelay {
			o.allowed = true
			o.delay = wait
		} else {
			// Waiting r µs lowers the delay by r, whether the key's time
			// stands still (the lag shrinks) or runs (the level drains):
			// the first r at which it fits under MaxDelay.
			o.retry = sub(wait, l.maxDelay)
		}
	}
	if o.allowed && n > 0 {
		level = ratAdd(level, ratInt(n))
		next = &bucketState{amount: level, ts: ts, unit: l.unit()}
	}
	o.remaining = max(floorRat(ratSub(capacity, level)), 0)
	if level.Sign() > 0 {
		o.reset = add(lag, l.usFor(level))
	}
	return o, next
}

// maxDrain is the longest a leaky bucket's level may take to drain, in
// µs, as any limit reads it: 2^47, twice the longest period or maximum
// delay, so a level a limit's own admissions leave (Burst, and what
// MaxDelay queues) is never above it. With the lag of a clock that stepped back
// from the latest valid time, every duration a decision reports stays
// within 2^53 µs.
const maxDrain = 1 << 47

// levelAt returns the level of a leaky bucket at now and the bucket's time:
// kept whole under the same unit, else converted to this limit's, rounded
// down and clamped to the most it can hold (Burst and what MaxDelay
// queues); then at most what drains in maxDrain; then drained for the time
// since ts unless the clock stepped back.
func levelAt(s *bucketState, l lim, now int64) (*big.Rat, int64) {
	if s == nil {
		return ratInt(0), now
	}
	// The most the bucket can hold: Burst, and what MaxDelay can queue.
	most := ratAdd(ratInt(l.burst), ratMul(ratInt(l.maxDelay), l.perUS()))
	level, ts := s.amount, s.ts
	if s.unit.Cmp(l.unit()) != 0 {
		level = ratMin(roundDown(level, l.unit()), most)
	}
	level = ratMin(level, l.drainable())
	if now > ts {
		drained := ratMul(ratInt(now-ts), l.perUS())
		level = ratMax(ratInt(0), ratSub(level, drained))
		ts = now
	}
	return level, ts
}

// drainable returns the tokens that drain in maxDrain under l.
func (l lim) drainable() *big.Rat { return ratMul(ratInt(maxDrain), l.perUS()) }
