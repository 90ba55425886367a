// Package model is a reference model of tollgate's six algorithms: the
// oracle the stores are tested against.
//
// It is written from the algorithms' definitions (the doc comments of
// tollgate.Algorithm, tollgate.Limit and tollgate.Result, and the headers of
// the Lua scripts), not from either store's code, and shares none of it: no
// fixed-point units, no precomputed Params, no shortcuts. Amounts of tokens,
// emission intervals and arrival times are exact rationals (math/big.Rat);
// counts and times are int64 with checked arithmetic. It is slow on purpose
// and keeps every key until its expiry, as the stores do.
//
// The semantics it encodes, beyond each algorithm's definition:
//
//   - A cost of 0 (a peek) is always allowed, with RetryAfter and Delay 0,
//     and changes nothing; Remaining and ResetAfter report the key's state.
//   - A denied request changes nothing.
//   - RetryAfter is exact to the microsecond: the same request made
//     RetryAfter later is admitted, one microsecond earlier it is not.
//   - When the clock steps back, time stands still for the key: the bucket
//     algorithms keep their last update time and add the lag to every
//     duration they report, the window algorithms stay in their newer
//     window, the sliding log keeps its newest entry's time, and GCRA counts
//     the lag against the key. A step back never admits more.
//   - Calendar windows (Limit.Calendar) are computed from the calendar of
//     the zone (see calendar.go) and counted as a slice of admissions.
//   - A key's state is kept per (key, algorithm, period, calendar), so a changed rate,
//     burst or maximum delay applies to what the key has already spent.
//     Token and leaky bucket amounts are kept in units of 1/u token, u =
//     period/gcd(rate, period) in µs, and a changed rate converts the amount
//     to the new unit rounded down; GCRA's theoretical arrival time is kept
//     in units of 1/v µs, v = rate/gcd(rate, period), and a changed rate
//     rounds it up to the new unit. A leaky bucket's level is read as at
//     most what drains in 2^47 µs under the reading limit, and a settle
//     charges it no further: a level left by a far faster rate of the same
//     unit would otherwise take centuries to drain.
//   - A state expires at the instant it is back to full under the limit of
//     the last call that set its expiry: now + ResetAfter of the admission
//     that wrote it, or of a later call that found it live with a
//     ResetAfter above 0 (a denial or a peek, which changes only the
//     expiry, never the state; or a settle). So it is never forgotten
//     before the RetryAfter that call reported. A settle that leaves it
//     full (ResetAfter 0) forgets it at once.
//   - Expiry is invisible. A state that has expired decides as no state,
//     under any limit of its algorithm and period (whatever its Rate, Burst
//     or MaxDelay), and the call that finds it so forgets it: a clock that
//     then steps back behind its expiry does not find it again. So a store
//     may delete a state at any moment once its clock has passed the
//     state's expiry (a Redis TTL that ran out, memory reclaimed) or keep
//     it for as long as it likes, and no decision can tell: it decides as
//     the model does either way, as long as its clock does not step back
//     behind that expiry before the next call on the key. (A store cannot
//     tell otherwise: a deleted state is gone, a kept one is live again.)
//     The model forgets an expired state only at a call on it, or when told
//     to (Reset).
//
// The model does not validate limits: give it only limits that
// tollgate.Limit.Validate accepts.
package model

import (
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/tollgate/tollgate"
)

// ErrCost is returned for a negative cost, or one above Capacity.
var ErrCost = errors.New("model: cost out of range")

// Model holds the state of every key. The zero value is not usable; call
// New. It is not safe for concurrent use.
type Model struct {
	states map[stateKey]entry
}

// entry is a state and when it expires (µs since the Unix epoch): from then
// on the key decides as if it held nothing, under any limit.
type entry struct {
	st      state
	expires int64
}

// stateKey is what a store keys its state by.
type stateKey struct {
	key    string
	alg    tollgate.Algorithm
	period time.Duration
	cal    tollgate.Calendar
}

func keyOf(key string, l tollgate.Limit) stateKey {
	return stateKey{key, l.Algorithm, l.Period, l.Calendar}
}

// state is one key's state. States are immutable: a decision that writes
// returns a new one, so Clone is a shallow copy of the map.
type state interface{ isState() }

// New returns a model that has seen no key.
func New() *Model { return &Model{states: make(map[stateKey]entry)} }

// Clone returns an independent copy of m: decisions on either do not affect
// the other. Use it to ask what would happen without changing m.
func (m *Model) Clone() *Model { return &Model{states: maps.Clone(m.states)} }

// Reset forgets key's state under limit's algorithm and period.
func (m *Model) Reset(key string, limit tollgate.Limit) {
	delete(m.states, keyOf(key, limit))
}

// Has reports whether the model holds state for key under limit's algorithm
// and period: whether a request has been admitted there that the model has
// not yet seen expire.
func (m *Model) Has(key string, limit tollgate.Limit) bool {
	_, ok := m.states[keyOf(key, limit)]
	return ok
}

// Expiry returns when key's state under limit's algorithm and period
// expires, in µs since the Unix epoch, and whether the model holds state
// there (Has). A call at or after that instant finds no state.
func (m *Model) Expiry(key string, limit tollgate.Limit) (int64, bool) {
	e, ok := m.states[keyOf(key, limit)]
	return e.expires, ok
}

// Capacity returns the largest cost one request can be admitted with under
// l: Burst for the bucket algorithms, plus, for a shaping leaky bucket, the
// whole tokens that drain within MaxDelay (⌊MaxDelay × Rate / Period⌋); Rate
// for the window algorithms.
func Capacity(l tollgate.Limit) int64 {
	switch l.Algorithm {
	case tollgate.TokenBucket, tollgate.GCRA:
		return int64(l.Burst)
	case tollgate.LeakyBucket:
		return add(int64(l.Burst), floorRat(ratMul(ratInt(us(l.MaxDelay)), ratFrac(int64(l.Rate), us(l.Period)))))
	default:
		return int64(l.Rate)
	}
}

// outcome is a decision in µs.
type outcome struct {
	allowed                        bool
	remaining, retry, reset, delay int64
}

// AllowN decides whether key may spend n under limit at now (µs since the
// Unix epoch), the way a Store's AllowN does at that instant, and records
// what it spent. It returns an error wrapping ErrCost, changing nothing, for
// a cost below 0 or above Capacity.
func (m *Model) AllowN(key string, limit tollgate.Limit, n int, now int64) (tollgate.Result, error) {
	if n < 0 || int64(n) > Capacity(limit) {
		return tollgate.Result{Limit: limit}, fmt.Errorf("%w: %d under %v (capacity %d)", ErrCost, n, limit, Capacity(limit))
	}
	sk := keyOf(key, limit)
	l := newLim(limit)
	e, live := m.states[sk]
	if live && now >= e.expires {
		delete(m.states, sk) // expired: the key holds nothing, under any limit
		live = false
	}
	old := e.st
	if !live {
		old = nil
	}
	var (
		o    outcome
		next state
	)
	switch limit.Algorithm {
	case tollgate.TokenBucket:
		o, next = tokenBucket(asBucket(old), l, now, int64(n))
	case tollgate.LeakyBucket:
		o, next = leakyBucket(asBucket(old), l, now, int64(n))
	case tollgate.GCRA:
		o, next = gcra(asGCRA(old), l, now, int64(n))
	case tollgate.FixedWindow:
		if limit.Calendar != (tollgate.Calendar{}) {
			o, next = calendarFixedWindow(asCalendar(old), l, limit.Calendar, now, int64(n))
		} else {
			o, next = fixedWindow(asWindow(old), l, now, int64(n))
		}
	case tollgate.SlidingWindowCounter:
		if limit.Calendar != (tollgate.Calendar{}) {
			o, next = calendarSlidingWindowCounter(asCalendar(old), l, limit.Calendar, now, int64(n))
		} else {
			o, next = slidingWindowCounter(asWindow(old), l, now, int64(n))
		}
	case tollgate.SlidingWindowLog:
		o, next = slidingWindowLog(asLog(old), l, now, int64(n))
	default:
		return tollgate.Result{Limit: limit}, fmt.Errorf("model: unknown algorithm %v", limit.Algorithm)
	}
	switch {
	case next != nil:
		if !o.allowed || n == 0 || o.reset == 0 {
			panic("model: a denial or a peek wrote state, or an admission left it full") // the model's own invariants
		}
		m.states[sk] = entry{next, add(now, o.reset)}
	case live && o.reset > 0:
		// A call that found the state live keeps it until it is full under
		// this call's limit: its content stays, its expiry moves.
		m.states[sk] = entry{old, add(now, o.reset)}
	}
	return tollgate.Result{
		Allowed:    o.allowed,
		Limit:      limit,
		Remaining:  int(o.remaining),
		RetryAfter: time.Duration(o.retry) * time.Microsecond,
		ResetAfter: time.Duration(o.reset) * time.Microsecond,
		Delay:      time.Duration(o.delay) * time.Microsecond,
	}, nil
}

// lim is a limit in µs, with its MaxDebt.
type lim struct {
	rate, burst, period, maxDelay int64
	capacity, maxDebt             int64
}

func newLim(l tollgate.Limit) lim {
	m := lim{rate: int64(l.Rate), burst: int64(l.Burst), period: us(l.Period), maxDelay: us(l.MaxDelay), capacity: Capacity(l)}
	m.maxDebt = MaxDebt(l)
	return m
}

// us returns d in whole µs; limits the model is given are whole µs.
func us(d time.Duration) int64 { return int64(d / time.Microsecond) }

// AllowAll decides n under every one of limits together at now, as a
// tollgate.Combiner does: when each limit alone would admit n, each
// spends it; otherwise none does, a limit that would deny is asked n
// (a denial, which changes only its expiry) and one that would admit is
// asked 0 (a look). It returns each limit's Result in order, or an error
// wrapping ErrCost, changing nothing, for a cost outside any limit's
// range. No two limits may share a state (algorithm, period and
// calendar).
func (m *Model) AllowAll(key string, limits []tollgate.Limit, n int, now int64) ([]tollgate.Result, error) {
	admits := make([]bool, len(limits))
	all := true
	trial := m.Clone()
	for i, l := range limits {
		for _, o := range limits[:i] {
			if keyOf(key, o) == keyOf(key, l) {
				return nil, fmt.Errorf("model: %v and %v share a state", o, l)
			}
		}
		r, err := trial.AllowN(key, l, n, now)
		if err != nil {
			return nil, err
		}
		admits[i] = r.Allowed
		all = all && r.Allowed
	}
	out := make([]tollgate.Result, len(limits))
	for i, l := range limits {
		cost := n
		if !all && admits[i] {
			cost = 0
		}
		out[i], _ = m.AllowN(key, l, cost, now)
	}
	return out, nil
}
