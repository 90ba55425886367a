// Package calendar finds the edges of the calendar windows a limit's
// tollgate.Calendar names — days, weeks (from Monday) and months in an IANA
// time zone — for the stores and for Limit's validation.
//
// A window of a local date D (a day, the Monday of a week, the 1st of a
// month) starts at the first instant whose local date in the zone is D or
// later, and ends where the next one starts. Local midnight is that
// instant on almost every date; where a change of offset skips midnight
// (America/Santiago's clocks go from 24:00 to 01:00 in September) the
// window starts at the change, and where midnight comes twice (America/
// Havana goes back from 01:00 to 00:00 in November) at the first. So a day
// is 23 or 25 hours long across a DST change, a month 28 to 31 days (and an
// hour either way), and every instant lies in exactly one window. Window
// edges fall on whole seconds, since offsets do.
package calendar

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Unit is a calendar unit: Day, Week or Month.
type Unit uint8

const (
	Day Unit = iota + 1
	Week
	Month
)

// String returns the unit as Calendar.Unit spells it.
func (u Unit) String() string {
	switch u {
	case Day:
		return "day"
	case Week:
		return "week"
	case Month:
		return "month"
	}
	return "unit(" + fmt.Sprint(uint8(u)) + ")"
}

// MaxLen is the longest window of unit u that a Spec accepts, in µs: two
// days, eight days, 32 days — beyond any zone's longest (25 hours, a week
// and an hour, 31 days and an hour), so that a limit's bounds hold for
// every window. A window found longer fails (ErrWindow).
func (u Unit) MaxLen() int64 {
	const day = 86_400_000_000
	switch u {
	case Day:
		return 2 * day
	case Week:
		return 8 * day
	default:
		return 32 * day
	}
}

// Nominal returns the nominal length of unit's longest window, in days:
// 1, 7 and 31 (a window across a DST change is an hour longer or shorter).
// It is what a door says of a calendar window where one length is wanted:
// RateLimit-Policy's w, a wait that no waiting shortens. 0 for an unknown
// unit.
func Nominal(unit string) time.Duration {
	switch unit {
	case "day":
		return 24 * time.Hour
	case "week":
		return 7 * 24 * time.Hour
	case "month":
		return 31 * 24 * time.Hour
	}
	return 0
}

// MaxZoneLen bounds a zone's name, in bytes: the longest IANA name is 30.
const MaxZoneLen = 64

// ErrWindow is returned for a window longer than its unit's MaxLen, which
// no zone of the time zone database has.
var ErrWindow = errors.New("calendar: window longer than its unit allows")

// Spec is one (unit, zone) pair, loaded: the zone's rules, and the windows
// found last. Lookup returns one Spec per pair for the life of the process,
// so two Specs are the same pair exactly when they are the same pointer.
type Spec struct {
	Unit Unit
	Zone string
	Loc  *time.Location
	// ID numbers the pairs from 1, in the order they were first looked
	// up: a small integer a store may key state by in this process.
	ID uint64
	// last holds recently found windows, in µs, tried before any search:
	// a limit's calls fall in one window for a day at least.
	last [4]atomic.Pointer[Span]
	next atomic.Uint32 // the slot of last the next search fills
}

// Span is the window containing an instant and its neighbours, in µs since
// the Unix epoch: windows [Prev, Start), [Start, End), [End, Next) and
// [Next, After).
type Span struct {
	Prev, Start, End, Next, After int64
}

var (
	mu    sync.Mutex
	specs = map[string]*Spec{} // by unit name + "@" + zone; only valid pairs
)

// Lookup returns the Spec of unit ("day", "week" or "month") in zone (an
// IANA name, such as "Europe/Berlin" or "UTC"), loading the zone once. A
// zone must be named: "" and "Local" are refused (their meaning depends on
// the machine, and replicas must agree on every window's edges), and so is
// any name over MaxZoneLen bytes or with a byte an IANA name never has.
func Lookup(unit, zone string) (*Spec, error) {
	var u Unit
	switch unit {
	case "day":
		u = Day
	case "week":
		u = Week
	case "month":
		u = Month
	default:
		return nil, fmt.Errorf("unknown calendar unit %q (want day, week or month)", unit)
	}
	mu.Lock()
	s := specs[unit+"@"+zone]
	mu.Unlock()
	if s != nil {
		return s, nil
	}
	if err := checkName(zone); err != nil {
		return nil, err
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, fmt.Errorf("unknown time zone %q (want an IANA name such as Europe/Berlin, or UTC)", zone)
	}
	mu.Lock()
	defer mu.Unlock()
	if s := specs[unit+"@"+zone]; s != nil {
		return s, nil
	}
	s = &Spec{Unit: u, Zone: zone, Loc: loc, ID: uint64(len(specs) + 1)}
	specs[unit+"@"+zone] = s
	return s, nil
}

// checkName refuses a zone name that is not one an IANA database can hold.
func checkName(zone string) error {
	switch {
	case zone == "":
		return errors.New("a calendar needs a time zone (an IANA name such as Europe/Berlin, or UTC)")
	case zone == "Local":
		return errors.New(`time zone "Local" is the machine's, and replicas may differ: name the zone (an IANA name such as Europe/Berlin, or UTC)`)
	case len(zone) > MaxZoneLen:
		return fmt.Errorf("time zone name of %d bytes, want at most %d", len(zone), MaxZoneLen)
	}
	for i := 0; i < len(zone); i++ {
		c := zone[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '/' || c == '_' || c == '-' || c == '+') {
			return fmt.Errorf("unknown time zone %q (want an IANA name such as Europe/Berlin, or UTC)", zone)
		}
	}
	return nil
}

// Window returns the span of windows around t (µs since the Unix epoch).
func (s *Spec) Window(t int64) (Span, error) {
	for i := range s.last {
		if w := s.last[i].Load(); w != nil && w.Start <= t && t < w.End {
			return *w, nil
		}
	}
	start, end := s.around(t)
	w := Span{Start: start, End: end}
	w.Prev, _ = s.around(start - 1)
	_, w.Next = s.around(end)
	_, w.After = s.around(w.Next)
	for _, l := range [...]int64{start - w.Prev, end - start, w.Next - end, w.After - w.Next} {
		if l > s.Unit.MaxLen() {
			return w, fmt.Errorf("%w: %d µs in %s around %v", ErrWindow, l, s.Zone, time.UnixMicro(t).UTC())
		}
	}
	s.last[s.next.Add(1)%uint32(len(s.last))].Store(&w)
	return w, nil
}

// around returns the window containing t, in µs.
func (s *Spec) around(t int64) (start, end int64) {
	lt := time.UnixMicro(t).In(s.Loc)
	y, m, d := lt.Date()
	switch s.Unit {
	case Week:
		d -= (int(lt.Weekday()) + 6) % 7 // back to Monday
	case Month:
		d = 1
	}
	start = first(s.Loc, y, m, d)
	switch s.Unit {
	case Day:
		d++
	case Week:
		d += 7
	case Month:
		m++
	}
	return start, first(s.Loc, y, m, d)
}

// first returns the first instant, in µs, whose local date in loc is the
// date (y, m, d) (normalized as time.Date does) or later.
func first(loc *time.Location, y int, m time.Month, d int) int64 {
	day := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	onOrAfter := func(t time.Time) bool {
		ly, lm, ld := t.In(loc).Date()
		return !time.Date(ly, lm, ld, 0, 0, 0, 0, time.UTC).Before(day)
	}
	c := time.Date(y, m, d, 0, 0, 0, 0, loc)
	// Offsets change on whole seconds, so the local date is the same over
	// the second before c: c is the first instant of the date if it is on
	// it and that second is not.
	if onOrAfter(c) && !onOrAfter(c.Add(-time.Second)) {
		return c.UnixMicro()
	}
	// Midnight skipped (time.Date then answers an instant of the day
	// before) or repeated: search the seconds around it, over which the
	// local date only moves forward.
	lo, hi := c.Unix()-2*86400, c.Unix()+2*86400 // lo before the date, hi on or after it
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if onOrAfter(time.Unix(mid, 0)) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi * 1_000_000
}
