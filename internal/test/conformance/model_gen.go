package conformance

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/store/exact"
	"github.com/tollgate/tollgate/internal/test/model"
)

// Gen generates random calls over the whole space of valid inputs of one
// algorithm: rates from 1 to 10^7, periods from 1µs to a year (small and
// large both common), bursts from 1 to as large as Validate allows, shaping
// leaky buckets, costs of 0, 1, random and the full capacity (and now and
// then one above it), rate, burst and maximum-delay changes on live keys,
// and a clock that stands still, steps forward by a µs or past a period,
// lands exactly on a RetryAfter, and steps back by a µs or by a lot.
type Gen struct {
	rng   *rand.Rand
	alg   tollgate.Algorithm
	limit tollgate.Limit
	now   int64 // µs since the Unix epoch
	last  tollgate.Result
	// ends: draw from the corners only (see NewEndsGen).
	ends bool
	// short: limits whose state is full again within shortSpan (see
	// NewShortGen).
	short bool
	// calendar: calendar windows around DST changes and Februaries (see
	// NewCalendarGen).
	calendar bool
}

// Call is one generated request: key number Key (of ModelKeys) at Now (µs
// since the Unix epoch).
type Call struct {
	Key   int
	Limit tollgate.Limit
	N     int
	Now   int64
}

// ModelKeys is how many keys a Gen spreads its calls over.
const ModelKeys = 3

// MaxLogRate bounds the rates Gen gives a sliding window log: the log keeps
// one entry per admitted request, and a decision's cost grows with them.
const MaxLogRate = 1000

// The clock stays between 2001 and 2190: inside what stores count exactly,
// with room for a year's step either way.
const (
	minNow = 1_000_000_000_000_000
	maxNow = 7_000_000_000_000_000
	year   = 365 * 24 * 3600 * 1_000_000
)

// NewGen returns a generator for alg drawing from src.
func NewGen(alg tollgate.Algorithm, src rand.Source) *Gen {
	g := &Gen{rng: rand.New(src), alg: alg}
	g.now = minNow + g.rng.Int64N(maxNow/2-minNow)
	g.limit = g.newLimit(g.period())
	return g
}

// NewEndsGen returns a generator for alg that draws only from the corners
// where a double is closest to losing count: a clock anywhere from 1µs
// after 1970 to exact.MaxNow, jumping between the two; periods a rate
// rarely divides, so that a changed rate keeps the unit and a bucket's
// amount is read whole; bursts and maximum delays at the largest Validate
// accepts, so that amounts reach toward 2^53; and costs of the whole
// capacity.
func NewEndsGen(alg tollgate.Algorithm, src rand.Source) *Gen {
	g := &Gen{rng: rand.New(src), alg: alg, ends: true}
	g.now = g.endsInstant()
	g.limit = g.newLimit(g.period())
	return g
}

// shortSpan bounds the limits of NewShortGen: their periods, the time a
// full burst takes to refill, and a shaper's maximum delay, in µs.
const shortSpan = 20_000

// NewShortGen returns a generator for alg whose limits all come back to
// full within a few shortSpans (periods up to 20ms, bursts that refill
// within 20ms, maximum delays up to 20ms; rates, bursts and delays changing
// as NewGen's do), for a store that decides in real time: its state then
// expires while the calls go on. The calls' Now is of no use there.
func NewShortGen(alg tollgate.Algorithm, src rand.Source) *Gen {
	g := &Gen{rng: rand.New(src), alg: alg, short: true}
	g.now = minNow
	g.limit = g.newLimit(g.period())
	return g
}

// NewCalendarGen returns a generator for alg (FixedWindow or
// SlidingWindowCounter) of calendar windows: days, weeks and months in
// Europe/Berlin (mostly), America/Santiago and UTC, at rates from 1 to a
// million, with the clock around Berlin's DST changes of 2027-03-28 and
// 2027-10-31 and the Februaries of 2027 and 2028 (a leap year). The clock
// stands still, steps by µs, hours or days, lands on RetryAfter,
// ResetAfter and a µs either side of a window's edge, steps back, and now
// and then jumps to another of those dates; the rate and the calendar
// change on live keys.
func NewCalendarGen(alg tollgate.Algorithm, src rand.Source) *Gen {
	g := &Gen{rng: rand.New(src), alg: alg, calendar: true}
	g.now = g.calendarInstant()
	g.limit = g.calendarLimit()
	return g
}

// calendarEras are the instants a calendar generator's clock stays near.
var calendarEras = []time.Time{
	time.Date(2027, 3, 28, 1, 0, 0, 0, time.UTC),  // Berlin: 02:00 CET is 03:00 CEST
	time.Date(2027, 10, 31, 1, 0, 0, 0, time.UTC), // Berlin: 03:00 CEST is 02:00 CET
	time.Date(2027, 2, 14, 12, 0, 0, 0, time.UTC), // February, 28 days
	time.Date(2028, 2, 15, 12, 0, 0, 0, time.UTC), // February, 29 days
	time.Date(2027, 9, 5, 4, 0, 0, 0, time.UTC),   // Santiago: 24:00 is 01:00
}

// calendarInstant returns an instant within ten days of an era.
func (g *Gen) calendarInstant() int64 {
	era := calendarEras[g.rng.IntN(len(calendarEras))].UnixMicro()
	return era + g.rng.Int64N(20*86_400_000_000) - 10*86_400_000_000
}

func (g *Gen) calendarLimit() tollgate.Limit {
	units := []string{"day", "week", "month"}
	zones := []string{"Europe/Berlin", "Europe/Berlin", "Europe/Berlin", "America/Santiago", "UTC"}
	l := tollgate.Limit{Algorithm: g.alg, Calendar: tollgate.Calendar{Unit: units[g.rng.IntN(len(units))], Zone: zones[g.rng.IntN(len(zones))]}}
	l.Rate = g.calendarRate()
	return l
}

func (g *Gen) calendarRate() int {
	switch g.rng.IntN(4) {
	case 0:
		return 1 + g.rng.IntN(3)
	case 1:
		return 1 + g.rng.IntN(20)
	default:
		return int(g.logUniform(1, 1_000_000))
	}
}

// moveCalendarClock moves a calendar generator's clock.
func (g *Gen) moveCalendarClock() {
	const hour = 3_600_000_000
	var d int64
	switch r := g.rng.IntN(100); {
	case r < 20: // frozen
	case r < 32:
		d = 1 + g.rng.Int64N(10)
	case r < 50:
		d = g.rng.Int64N(2 * 24 * hour)
	case r < 58:
		d = durUS(g.last.RetryAfter)
	case r < 62:
		d = durUS(g.last.RetryAfter) - 1
	case r < 70:
		d = durUS(g.last.ResetAfter) - g.rng.Int64N(2)
	case r < 80: // a µs either side of the window's end
		_, end := model.CalendarWindow(g.limit.Calendar, g.now)
		d = end - g.now + g.rng.Int64N(3) - 1
	case r < 86:
		d = g.rng.Int64N(40 * 24 * hour)
	case r < 92:
		d = -1 - g.rng.Int64N(10)
	case r < 97:
		d = -g.rng.Int64N(3 * 24 * hour)
	default:
		g.now = g.calendarInstant()
		return
	}
	g.now += d
	if g.now < calendarEras[2].UnixMicro()-60*24*hour || g.now > calendarEras[3].UnixMicro()+60*24*hour {
		g.now = g.calendarInstant()
	}
}

// endsInstant returns an instant near one end of the valid clock, or
// anywhere on it.
func (g *Gen) endsInstant() int64 {
	switch g.rng.IntN(3) {
	case 0:
		return 1 + g.logUniform(1, year)
	case 1:
		return exact.MaxNow - g.logUniform(1, year) + 1
	default:
		return 1 + g.rng.Int64N(exact.MaxNow)
	}
}

// endsPeriod returns a period for NewEndsGen: a prime number of µs, a power
// of two, or any.
func (g *Gen) endsPeriod() time.Duration {
	periods := []int64{1, 129, 1_000_003, 10_000_000, 10_802_237_922_549, 1 << 45, exact.MaxHorizon}
	if g.rng.IntN(4) == 0 {
		return time.Duration(g.logUniform(1, exact.MaxHorizon)) * time.Microsecond
	}
	return time.Duration(periods[g.rng.IntN(len(periods))]) * time.Microsecond
}

// endsLimit returns a limit of period for NewEndsGen: a burst at the largest
// Validate accepts (or 1), and a shaper's maximum delay at its largest.
func (g *Gen) endsLimit(period time.Duration) tollgate.Limit {
	l := tollgate.Limit{Algorithm: g.alg, Period: period, Rate: int(g.logUniform(1, exact.Max-1))}
	if g.alg == tollgate.SlidingWindowLog {
		l.Rate = int(g.logUniform(1, MaxLogRate))
	}
	if g.rng.IntN(3) == 0 {
		l.Rate = 1 + g.rng.IntN(1000)
	}
	switch g.alg {
	case tollgate.TokenBucket, tollgate.GCRA, tollgate.LeakyBucket:
		l.Burst = 1
		if g.rng.IntN(4) != 0 {
			l.Burst = largest(1, 1<<53, func(v int) bool { l.Burst = v; return l.Validate() == nil })
		}
		if g.alg == tollgate.LeakyBucket && g.rng.IntN(2) == 0 {
			us := largest(1, exact.MaxHorizon, func(v int) bool {
				l.MaxDelay = time.Duration(v) * time.Microsecond
				return l.Validate() == nil
			})
			l.MaxDelay = time.Duration(us) * time.Microsecond
		}
	}
	for l.Validate() != nil { // a rate too fine for the counter, or above what a burst of 1 allows
		l.Rate = max(1, l.Rate/2)
		l.Burst = min(l.Burst, 1)
	}
	return l
}

// largest returns the largest v in [lo, hi] for which ok holds, ok being
// true at lo and, once false, false above; lo when it never holds.
func largest(lo, hi int, ok func(int) bool) int {
	if !ok(lo) {
		return lo
	}
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if ok(mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// logUniform returns an integer in [lo, hi], its logarithm uniform.
func (g *Gen) logUniform(lo, hi int64) int64 {
	if hi <= lo {
		return lo
	}
	v := int64(math.Exp(math.Log(float64(lo)) + g.rng.Float64()*(math.Log(float64(hi))-math.Log(float64(lo)))))
	return min(max(v, lo), hi)
}

func (g *Gen) period() time.Duration {
	if g.ends {
		return g.endsPeriod()
	}
	if g.short {
		return time.Duration(g.logUniform(1, shortSpan)) * time.Microsecond
	}
	round := []time.Duration{
		time.Microsecond, 7 * time.Microsecond, time.Millisecond, 333 * time.Millisecond,
		time.Second, 1500 * time.Millisecond, time.Minute, time.Hour, 24 * time.Hour,
		7 * 24 * time.Hour, 30 * 24 * time.Hour, 365 * 24 * time.Hour,
	}
	switch r := g.rng.IntN(10); {
	case r < 3:
		return time.Duration(g.logUniform(1, 1000)) * time.Microsecond
	case r < 7:
		return time.Duration(g.logUniform(1, year)) * time.Microsecond
	default:
		return round[g.rng.IntN(len(round))]
	}
}

func (g *Gen) rate(period time.Duration) int {
	top := int64(10_000_000)
	if g.alg == tollgate.SlidingWindowLog {
		top = MaxLogRate
	}
	periodUS := int64(period / time.Microsecond)
	switch g.rng.IntN(8) {
	case 0:
		return 1 + g.rng.IntN(3)
	case 1: // a divisor or a multiple of the period in µs: an exact interval
		if d := 1 + g.rng.Int64N(min(periodUS, 1000)); periodUS%d == 0 && periodUS/d <= top {
			return int(periodUS / d)
		}
		return int(min(periodUS*(1+g.rng.Int64N(10)), top))
	case 2:
		return int(top)
	default:
		return int(g.logUniform(1, top))
	}
}

// newLimit returns a valid limit of the generator's algorithm and period.
// What Validate refuses is drawn again with a smaller rate or burst: it is
// the boundary, and the boundary is what should be covered.
func (g *Gen) newLimit(period time.Duration) tollgate.Limit {
	if g.ends {
		return g.endsLimit(period)
	}
	l := tollgate.Limit{Algorithm: g.alg, Period: period, Rate: g.rate(period)}
	switch g.alg {
	case tollgate.TokenBucket, tollgate.GCRA, tollgate.LeakyBucket:
		switch g.rng.IntN(6) {
		case 0:
			l.Burst = 1
		case 1:
			l.Burst = l.Rate
		default:
			l.Burst = int(g.logUniform(1, 1<<40))
		}
		if g.alg == tollgate.LeakyBucket && g.rng.IntN(2) == 0 {
			l.MaxDelay = time.Duration(g.logUniform(1, min(3*int64(period/time.Microsecond), 1<<46))) * time.Microsecond
		}
		if g.short {
			// A full burst refills within shortSpan, as a shaper's queue drains.
			l.Burst = int(min(int64(l.Burst), max(1, shortSpan*int64(l.Rate)/int64(period/time.Microsecond))))
			l.MaxDelay = min(l.MaxDelay, shortSpan*time.Microsecond)
		}
	}
	for l.Validate() != nil {
		switch {
		case l.Burst > 1:
			l.Burst /= 2
		case l.MaxDelay > time.Microsecond:
			l.MaxDelay = l.MaxDelay / 2 / time.Microsecond * time.Microsecond
		case l.Rate > 1:
			l.Rate /= 2
		default:
			panic(fmt.Sprintf("conformance: no valid limit near %v: %v", l, l.Validate()))
		}
	}
	return l
}

// Next returns the next call.
func (g *Gen) Next() Call {
	g.moveLimit()
	g.moveClock()
	return Call{Key: g.rng.IntN(ModelKeys), Limit: g.limit, N: g.cost(), Now: g.now}
}

// Saw tells the generator what the last call returned, so that it can aim
// the clock at the instants that matter: RetryAfter, Delay, ResetAfter.
func (g *Gen) Saw(r tollgate.Result) { g.last = r }

func (g *Gen) moveLimit() {
	if g.calendar {
		switch r := g.rng.IntN(100); {
		case r < 3: // another calendar: state of its own
			g.limit = g.calendarLimit()
		case r < 10: // a rate change on live keys
			g.limit.Rate = g.calendarRate()
		}
		return
	}
	switch r := g.rng.IntN(100); {
	case r < 2: // another period: state of its own
		g.limit = g.newLimit(g.period())
	case r < 8: // a rate, burst or delay change on live keys
		next := g.newLimit(g.limit.Period)
		switch g.rng.IntN(3) {
		case 0:
			next.Burst, next.MaxDelay = g.limit.Burst, g.limit.MaxDelay
		case 1:
			next.Rate = g.limit.Rate
		}
		if next.Validate() != nil {
			next = g.newLimit(g.limit.Period)
		}
		g.limit = next
	}
}

func (g *Gen) moveClock() {
	if g.calendar {
		g.moveCalendarClock()
		return
	}
	periodUS := int64(g.limit.Period / time.Microsecond)
	var d int64
	switch r := g.rng.IntN(100); {
	case r < 30: // frozen
	case r < 45:
		d = 1 + g.rng.Int64N(10)
	case r < 60:
		d = g.rng.Int64N(min(2*periodUS, year) + 1)
	case r < 68:
		d = max(durUS(g.last.RetryAfter), durUS(g.last.Delay))
	case r < 72:
		d = durUS(g.last.RetryAfter) - 1
	case r < 76:
		d = durUS(g.last.ResetAfter) - g.rng.Int64N(2)
	case r < 82:
		d = min(periodUS*(1+g.rng.Int64N(10)), 2*year)
	case r < 85:
		d = g.logUniform(1, year)
	case r < 93:
		d = -1 - g.rng.Int64N(10)
	default:
		d = -g.logUniform(1, min(2*periodUS, year))
	}
	if g.ends {
		switch g.rng.IntN(20) {
		case 0:
			g.now = g.endsInstant()
		default:
			g.now = min(max(g.now+d, 1), exact.MaxNow)
		}
		return
	}
	g.now += min(d, 2*year) // a RetryAfter can be centuries
	for g.now > maxNow {    // back by a year or two, and on
		g.now -= year + g.rng.Int64N(year)
	}
	g.now = max(g.now, minNow)
}

func durUS(d time.Duration) int64 { return int64(d / time.Microsecond) }

func (g *Gen) cost() int {
	c := g.limit.Capacity()
	switch r := g.rng.IntN(100); {
	case r < 15:
		return 0
	case r < 45:
		return 1
	case r < 75:
		return g.rng.IntN(c + 1)
	case r < 83:
		return c
	case r < 91:
		return min(c, 2+g.rng.IntN(20)) // several at one instant
	case r < 98:
		return int(g.logUniform(1, int64(c)))
	default:
		return c + 1 + g.rng.IntN(3) // refused, changes nothing
	}
}

// ByteSource is a rand.Source that reads its numbers from a byte string,
// eight bytes each, and then from a fixed pseudo-random sequence (zeros
// forever would stall rand's rejection sampling): it lets a fuzzer drive a
// Gen.
type ByteSource struct {
	data []byte
	tail *rand.PCG
}

// NewByteSource returns a ByteSource reading data.
func NewByteSource(data []byte) *ByteSource {
	return &ByteSource{data: data, tail: rand.NewPCG(1, 2)}
}

// Uint64 implements rand.Source.
func (s *ByteSource) Uint64() uint64 {
	if len(s.data) == 0 {
		return s.tail.Uint64()
	}
	var b [8]byte
	k := copy(b[:], s.data)
	s.data = s.data[k:]
	return binary.LittleEndian.Uint64(b[:])
}

// Len reports how many bytes are left to read.
func (s *ByteSource) Len() int { return len(s.data) }
