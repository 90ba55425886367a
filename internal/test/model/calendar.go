package model

import (
	"sync"
	"time"

	"github.com/tollgate/tollgate"
)

// Calendar windows (tollgate.Limit.Calendar), from their definition: the
// window of a local date D — the day itself, the Monday on or before it,
// the 1st of its month — starts at the first instant whose local date in
// the zone is D or later, and ends where the next unit's starts. The model
// finds that instant with time.Date and then walks second by second
// (offsets change on whole seconds) past any skipped or repeated midnight:
// slow, and shares nothing with the stores' search.

var (
	zonesMu sync.Mutex
	zones   = map[string]*time.Location{}
)

func zone(name string) *time.Location {
	zonesMu.Lock()
	defer zonesMu.Unlock()
	loc := zones[name]
	if loc == nil {
		var err error
		if loc, err = time.LoadLocation(name); err != nil {
			panic("model: give it only valid limits: " + err.Error())
		}
		zones[name] = loc
	}
	return loc
}

// localDate returns t's local date in loc as midnight UTC of that date.
func localDate(t time.Time, loc *time.Location) time.Time {
	y, m, d := t.In(loc).Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// firstInstant returns the first instant whose local date in loc is date
// (midnight UTC of it) or later, in µs.
func firstInstant(loc *time.Location, date time.Time) int64 {
	t := time.Date(date.Year(), date.Month(), date.Day(), 0, 0, 0, 0, loc)
	for !localDate(t, loc).Before(date) && !localDate(t.Add(-time.Second), loc).Before(date) {
		t = t.Add(-time.Second)
	}
	for localDate(t, loc).Before(date) {
		t = t.Add(time.Second)
	}
	return t.UnixMicro()
}

// CalendarWindow returns the calendar window [start, end) of c containing
// t, in µs since the Unix epoch.
func CalendarWindow(c tollgate.Calendar, t int64) (start, end int64) {
	loc := zone(c.Zone)
	date := localDate(time.UnixMicro(t), loc)
	var next time.Time
	switch c.Unit {
	case "day":
		next = date.AddDate(0, 0, 1)
	case "week":
		for date.Weekday() != time.Monday {
			date = date.AddDate(0, 0, -1)
		}
		next = date.AddDate(0, 0, 7)
	case "month":
		date = time.Date(date.Year(), date.Month(), 1, 0, 0, 0, 0, time.UTC)
		next = date.AddDate(0, 1, 0)
	default:
		panic("model: give it only valid limits: calendar unit " + c.Unit)
	}
	return firstInstant(loc, date), firstInstant(loc, next)
}

// calendarState is a calendar window's state: every admission still
// counted, with the start of the window it was counted in. Counts are sums
// over this slice; the key's window is the newest start in it.
type calendarState struct {
	admits []calendarAdmit
}

type calendarAdmit struct{ window, n int64 }

func (*calendarState) isState() {}

func asCalendar(s state) *calendarState {
	c, _ := s.(*calendarState)
	return c
}

// newest returns the newest window start the state counts in, or false.
func (s *calendarState) newest() (int64, bool) {
	if s == nil || len(s.admits) == 0 {
		return 0, false
	}
	w := s.admits[0].window
	for _, a := range s.admits {
		w = max(w, a.window)
	}
	return w, true
}

// count sums the admissions counted in the window starting at w.
func (s *calendarState) count(w int64) int64 {
	var c int64
	if s != nil {
		for _, a := range s.admits {
			if a.window == w {
				c = add(c, a.n)
			}
		}
	}
	return c
}

// with returns the state after admitting n in the window starting at w,
// keeping only the admissions of w and of the window before it (no
// decision reads older ones).
func (s *calendarState) with(c tollgate.Calendar, w, n int64) *calendarState {
	before, _ := CalendarWindow(c, w-1)
	next := &calendarState{}
	if s != nil {
		for _, a := range s.admits {
			if a.window == w || a.window == before {
				next.admits = append(next.admits, a)
			}
		}
	}
	next.admits = append(next.admits, calendarAdmit{w, n})
	return next
}

// calendarWindowOf returns the window the key decides in at now: the one
// containing now, or the key's newer window if the clock stepped back.
func calendarWindowOf(s *calendarState, c tollgate.Calendar, now int64) (start, end int64) {
	start, end = CalendarWindow(c, now)
	if w, ok := s.newest(); ok && w > start {
		start, end = CalendarWindow(c, w)
	}
	return start, end
}

// calendarFixedWindow admits Rate per calendar window.
func calendarFixedWindow(s *calendarState, l lim, c tollgate.Calendar, now, n int64) (outcome, state) {
	start, end := calendarWindowOf(s, c, now)
	count := s.count(start)
	var o outcome
	var next state
	switch {
	case n == 0:
		o.allowed = true
	case add(count, n) <= l.rate:
		o.allowed = true
		count += n
		next = s.with(c, start, n)
	default:
		o.retry = end - now // the next window starts empty
	}
	o.remaining = max(l.rate-count, 0)
	if count > 0 {
		o.reset = end - now
	}
	return o, next
}

// calendarSecond is the step at which the sliding window counter weighs
// the previous calendar window.
const calendarSecond = 1_000_000

// calendarSlidingWindowCounter estimates the requests of the sliding
// window at now, in the calendar window [start, end), as its count plus
// the previous window's count × (steps − step)/steps: steps the whole
// seconds of [start, end), step those elapsed since start. The previous
// window weighs the share of the current one still to come, whatever
// their lengths.
func calendarSlidingWindowCounter(s *calendarState, l lim, c tollgate.Calendar, now, n int64) (outcome, state) {
	start, end := calendarWindowOf(s, c, now)
	before, _ := CalendarWindow(c, start-1)
	_, after := CalendarWindow(c, end)
	cur, prev := s.count(start), s.count(before)
	// fits reports whether a cost n fits at instant t of the window [a, b)
	// with counts (cur, prev).
	fits := func(a, b, t, cur, prev int64) bool {
		steps := (b - a) / calendarSecond
		step := (max(t, a) - a) / calendarSecond
		return add(mul(prev, steps-step), mul(add(cur, n), steps)) <= mul(l.rate, steps)
	}
	var o outcome
	var next state
	switch {
	case n == 0:
		o.allowed = true
	case fits(start, end, now, cur, prev):
		o.allowed = true
		next = s.with(c, start, n)
		cur += n
	default:
		// The first second at which it fits: in this window, or in the
		// next, where this window's count is the previous one; else at
		// the next window's end, where nothing weighs.
		at := after
		for _, w := range [][4]int64{{start, end, cur, prev}, {end, after, 0, cur}} {
			if t, ok := firstFit(w[0], w[1], func(t int64) bool { return fits(w[0], w[1], t, w[2], w[3]) }); ok {
				at = t
				break
			}
		}
		o.retry = at - now
	}
	steps := (end - start) / calendarSecond
	step := (max(now, start) - start) / calendarSecond
	room := mul(l.rate, steps) - mul(prev, steps-step) - mul(cur, steps)
	o.remaining = max(floorDiv(room, steps), 0)
	switch {
	case cur > 0:
		o.reset = after - now
	case prev > 0:
		o.reset = end - now
	}
	return o, next
}

// firstFit returns the first whole second from a within [a, b) at which
// ok holds, ok being monotone in time, by bisection.
func firstFit(a, b int64, ok func(t int64) bool) (int64, bool) {
	steps := (b - a) / calendarSecond
	if !ok(a + (steps-1)*calendarSecond) {
		return 0, false
	}
	lo, hi := int64(0), steps-1
	for lo < hi {
		mid := lo + (hi-lo)/2
		if ok(a + mid*calendarSecond) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return a + lo*calendarSecond, true
}
