package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Deadlines gives store calls a deadline without a runtime timer per call.
//
// context.WithTimeout on every request costs a timer of its own and four
// allocations — on memorystore about twice the decision itself, and at tens
// of thousands of decisions a second the runtime's timer locks show in
// profiles. Instead, calls that start within one step of each other share
// one context whose deadline is timeout+step after the first of them, so
// each call gets a deadline between timeout and timeout+step after its
// start, and one timer serves them all. The step is timeout/8, at most 1 ms:
// a deadline is never more than a millisecond late, and a busy service
// makes at most a thousand contexts a second.
//
// The current epoch is read with one atomic load and one reading of the
// monotonic clock (time.Since, half the cost of time.Now, which reads the
// wall clock too); only the call that finds it stale takes the lock to
// make the next one. Deadlines keep the monotonic clock reading, so a step
// of the wall clock moves none of them.
//
// A Deadlines is safe for concurrent use. It holds no goroutine; the
// contexts of the epochs that expired are released at the next rotation.
type Deadlines struct {
	timeout, step time.Duration
	origin        time.Time // what epochs' until counts from, on the monotonic clock
	cur           atomic.Pointer[epoch]

	mu  sync.Mutex // serializes rotation
	old []*epoch   // epochs whose contexts may still be in use
}

type epoch struct {
	ctx      context.Context
	cancel   context.CancelFunc
	deadline time.Time
	until    time.Duration // hand it out to calls starting before origin + until
}

// NewDeadlines returns Deadlines that give each call at least timeout
// (which must be positive) and at most timeout + min(timeout/8, 1 ms).
func NewDeadlines(timeout time.Duration) *Deadlines {
	return &Deadlines{timeout: timeout, step: min(max(timeout/8, time.Microsecond), time.Millisecond), origin: time.Now()}
}

// Context returns a context with parent's values whose deadline is shared
// with the calls starting at about the same time: between the timeout and
// the timeout plus one step from now. It does not see parent's deadline or
// cancellation: a call whose caller went away still ends by its own
// deadline, which is short, rather than pay for watching the parent.
func (d *Deadlines) Context(parent context.Context) context.Context {
	return &withValues{Context: d.current().ctx, values: parent}
}

// MaxReplyReserve is the most of a caller's remaining time that AnswerBy
// keeps back for the answer's way to the caller.
const MaxReplyReserve = 10 * time.Millisecond

// ReplyReserve is how much of remaining — the time a caller has left when
// a request arrives — AnswerBy keeps for the answer: half, at most
// MaxReplyReserve. A failure-mode answer takes microseconds to decide; the
// reserve is for waking up after the store's deadline, marshalling the
// answer and the wire, on a machine that may be short of CPU. There the
// wake-up is what takes longest: of the answers that reached a 20 ms
// caller too late, nearly all left the service too late, and a quarter
// (5 ms) kept back missed several times as many as half (see "Failure" in
// docs/service.md). A healthy store answers within a millisecond either
// way.
func ReplyReserve(remaining time.Duration) time.Duration {
	return min(max(remaining, 0)/2, MaxReplyReserve)
}

// AnswerBy returns the context for the store calls of a request whose
// caller waits for the answer (a decision service): they end at the sooner
// of the shared deadline (Context) and the caller's deadline less its
// ReplyReserve, so that when the store is slow the failure mode's answer
// still reaches the caller before it gives up. Without a caller's deadline
// it is Context. A nil *Deadlines (no timeout of the service's own) bounds
// the calls by the caller's deadline alone. The returned cancel must be
// called when the calls are done; it is a no-op when the shared deadline
// serves.
func (d *Deadlines) AnswerBy(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel, _ := d.AnswerIn(parent, nil)
	return ctx, cancel
}

// Room is memory for the context AnswerIn makes when the shared deadline
// serves: a caller that keeps one per request allocates nothing there.
type Room struct{ withValues }

// AnswerIn is AnswerBy, making the context in room (when not nil) if the
// shared deadline serves; shared reports that it does, and so that the
// context leaves the calls at least the timeout: it has not expired.
func (d *Deadlines) AnswerIn(parent context.Context, room *Room) (ctx context.Context, cancel context.CancelFunc, shared bool) {
	dl, ok := parent.Deadline()
	if d == nil {
		if !ok {
			return parent, func() {}, false
		}
		ctx, cancel = context.WithDeadline(parent, dl.Add(-ReplyReserve(time.Until(dl))))
		return ctx, cancel, false
	}
	ep := d.current()
	if ok {
		if by := dl.Add(-ReplyReserve(time.Until(dl))); !ep.deadline.Before(by) {
			// The caller's deadline comes first: a timer of its own, which
			// only callers in a hurry pay for.
			ctx, cancel = context.WithDeadline(parent, by)
			return ctx, cancel, false
		}
	}
	if room == nil {
		room = new(Room)
	}
	room.withValues = withValues{Context: ep.ctx, values: parent}
	return room, func() {}, true
}

// current returns the epoch for a call starting now.
func (d *Deadlines) current() *epoch {
	if ep := d.cur.Load(); ep != nil && time.Since(d.origin) < ep.until {
		return ep
	}
	return d.rotate()
}

func (d *Deadlines) rotate() *epoch {
	d.mu.Lock()
	defer d.mu.Unlock()
	// Read the clock under the lock: a caller that waited for it (or was
	// descheduled) must not create an epoch that has already expired.
	now := time.Now()
	elapsed := now.Sub(d.origin)
	if ep := d.cur.Load(); ep != nil && elapsed < ep.until {
		return ep // another call rotated first
	}
	// Release the epochs whose timers have fired: this only drops the
	// references. One past its deadline whose timer is late (a loaded
	// machine) stays until it fires: cancelling it would end its calls with
	// context.Canceled instead of DeadlineExceeded.
	keep := d.old[:0]
	for _, o := range d.old {
		if o.ctx.Err() != nil {
			o.cancel()
		} else {
			keep = append(keep, o)
		}
	}
	clear(d.old[len(keep):])
	d.old = keep
	deadline := now.Add(d.timeout + d.step)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	ep := &epoch{ctx: ctx, cancel: cancel, deadline: deadline, until: elapsed + d.step}
	d.old = append(d.old, ep)
	d.cur.Store(ep)
	return ep
}

// withValues is the shared deadline context (Deadline, Done, Err) with the
// values of the call's own context (trace IDs, ...).
type withValues struct {
	context.Context
	values context.Context
}

func (c *withValues) Value(key any) any { return c.values.Value(key) }
