package enforce

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// deadlines gives store calls a deadline without a timer per request.
//
// context.WithTimeout on every request costs a runtime timer and four
// allocations — on memorystore, about twice the decision itself. Instead,
// requests that start within one step (timeout/8) of each other share one
// context whose deadline is timeout+step after the first of them: each
// request gets a deadline between timeout and timeout+step from its start,
// and one timer serves them all. A request's own values (trace IDs, ...)
// stay visible through withValues.
//
// The shared context does not see the request's cancellation: a client that
// goes away does not cut its store call short, which is bounded by the
// deadline anyway. A request whose own deadline is sooner uses its own
// context unchanged.
type deadlines struct {
	timeout, step time.Duration
	cur           atomic.Pointer[epoch]

	mu  sync.Mutex // serializes rotation
	old []*epoch   // epochs whose contexts may still be in use
}

type epoch struct {
	ctx      context.Context
	cancel   context.CancelFunc
	deadline time.Time
	until    time.Time // hand it out to requests starting before this
}

func newDeadlines(timeout time.Duration) *deadlines {
	return &deadlines{timeout: timeout, step: max(timeout/8, time.Microsecond)}
}

// bound returns ctx bounded by the deadline.
func (d *deadlines) bound(ctx context.Context) context.Context {
	now := time.Now()
	ep := d.cur.Load()
	if ep == nil || !now.Before(ep.until) {
		ep = d.rotate()
	}
	if dl, ok := ctx.Deadline(); ok && !dl.After(ep.deadline) {
		return ctx // its own deadline comes first
	}
	return &withValues{Context: ep.ctx, values: ctx}
}

func (d *deadlines) rotate() *epoch {
	d.mu.Lock()
	defer d.mu.Unlock()
	// Read the clock under the lock: a caller that waited for it (or was
	// descheduled) must not create an epoch that has already expired.
	now := time.Now()
	if ep := d.cur.Load(); ep != nil && now.Before(ep.until) {
		return ep // another request rotated first
	}
	// Release the epochs that have expired: their timers have fired, this
	// only drops the references.
	keep := d.old[:0]
	for _, o := range d.old {
		if now.After(o.deadline) {
			o.cancel()
		} else {
			keep = append(keep, o)
		}
	}
	d.old = keep
	deadline := now.Add(d.timeout + d.step)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	ep := &epoch{ctx: ctx, cancel: cancel, deadline: deadline, until: now.Add(d.step)}
	d.old = append(d.old, ep)
	d.cur.Store(ep)
	return ep
}

// withValues is the shared deadline context (Deadline, Done, Err) with the
// values of the request's context.
type withValues struct {
	context.Context
	values context.Context
}

func (c *withValues) Value(key any) any { return c.values.Value(key) }
