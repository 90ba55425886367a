package server

import (
	"context"
	"sync"
	"time"
)

// deadlines hands out request contexts whose deadline is rounded up to the
// next millisecond, and shares one timer among all the requests whose
// deadline falls in the same millisecond. context.WithTimeout costs a timer
// of its own per request — at tens of thousands of decisions a second, the
// runtime's timer locks were 7% of the service's CPU.
type deadlines struct {
	mu      sync.Mutex
	buckets map[int64]chan struct{} // by deadline in Unix milliseconds
}

// with returns a context that is done at now+d rounded up to the next
// millisecond. It carries parent's values but not its cancellation: a
// request whose caller went away still finishes within its deadline, which
// is short, rather than pay for watching the parent.
func (dl *deadlines) with(parent context.Context, now time.Time, d time.Duration) context.Context {
	at := now.Add(d)
	ms := (at.UnixNano() + int64(time.Millisecond) - 1) / int64(time.Millisecond)
	dl.mu.Lock()
	done, ok := dl.buckets[ms]
	if !ok {
		if dl.buckets == nil {
			dl.buckets = map[int64]chan struct{}{}
		}
		done = make(chan struct{})
		dl.buckets[ms] = done
		time.AfterFunc(time.Until(time.UnixMilli(ms)), func() {
			dl.mu.Lock()
			delete(dl.buckets, ms)
			dl.mu.Unlock()
			close(done)
		})
	}
	dl.mu.Unlock()
	return &deadlineCtx{Context: parent, deadline: time.UnixMilli(ms), done: done}
}

type deadlineCtx struct {
	context.Context
	deadline time.Time
	done     chan struct{}
}

func (c *deadlineCtx) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *deadlineCtx) Done() <-chan struct{}       { return c.done }

func (c *deadlineCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}
