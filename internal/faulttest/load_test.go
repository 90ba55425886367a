package faulttest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
)

// A call is what a load goroutine decides on: key, limit and cost. The
// admitted cost and the failures of calls marked count are added up per
// key.
type call struct {
	key   string
	limit tollgate.Limit
	n     int
	count bool
}

// A load makes decisions from many goroutines, each as fast as it can,
// until stop, and records for each goroutine what a fault looked like to
// it: when its first and last decisions failed, when it succeeded again,
// how long each call took, and what the errors were.
type load struct {
	canary  canary
	lims    []*tollgate.Limiter // goroutine g decides with lims[g%len(lims)]
	stopped chan struct{}
	wg      sync.WaitGroup
	workers []*worker
}

// worker is one goroutine's record. Its mutex is only contended when the
// test reads a summary.
type worker struct {
	mu         sync.Mutex
	lim        int // the index in load.lims of the Limiter it decides with
	calls      int
	errs       int
	errsMarked int // failed calls since the last mark
	allowed    int
	admitted   map[string]int // cost admitted per key, by counted calls
	failed     map[string]int // failed decisions per key, by counted calls
	maxDur     time.Duration
	maxOwn     time.Duration // the longest call minus the stalls during it
	errDurSum  time.Duration
	errDurMax  time.Duration
	late       int       // calls longer than deadline + margin, stalls not counted
	firstErr   time.Time // when the first failed call since the last mark returned
	okAfter    time.Time // when the first success after firstErr returned; zero if none yet
	lastErr    time.Time // when the last failed call returned
	lastOK     time.Time // when the last successful call returned
	classes    map[string]int
	samples    map[string]string
	panics     []string
}

// startLoad starts goroutines that call AllowN with what next returns for
// goroutine g's i-th call, on lims[g%len(lims)]. The load stops by itself
// when the test ends.
func startLoad(t *testing.T, lims []*tollgate.Limiter, goroutines int, next func(g, i int) call) *load {
	t.Helper()
	l := &load{lims: lims, stopped: make(chan struct{})}
	for g := range goroutines {
		w := &worker{lim: g % len(lims), classes: map[string]int{}, samples: map[string]string{}, admitted: map[string]int{}, failed: map[string]int{}}
		l.workers = append(l.workers, w)
		l.wg.Go(func() { w.run(l, lims[g%len(lims)], g, next) })
	}
	l.wg.Go(func() { l.canary.run(l.stopped) })
	t.Cleanup(func() { l.stop() })
	return l
}

// canary measures how late the process wakes a sleeping goroutine: when
// the machine or the runtime stalls, every goroutine is late by as much,
// decisions included. lost adds up all that lateness, so a call can tell
// how much of its own duration the process spent stalled.
type canary struct {
	lost  atomic.Int64 // total lateness, ns
	mu    sync.Mutex
	worst time.Duration
}

func (c *canary) run(stop <-chan struct{}) {
	const tick = 5 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			now := time.Now()
			if late := now.Sub(last) - tick; late > 0 {
				c.lost.Add(int64(late))
				c.mu.Lock()
				c.worst = max(c.worst, late)
				c.mu.Unlock()
			}
			last = now
		}
	}
}

func (w *worker) run(l *load, lim *tollgate.Limiter, g int, next func(g, i int) call) {
	for i := 0; ; i++ {
		select {
		case <-l.stopped:
			return
		default:
		}
		if !w.decide(l, lim, next(g, i)) {
			return
		}
	}
}

// decide makes one decision and records it; it returns false if the call
// panicked (the panic is recorded, and the goroutine stops).
func (w *worker) decide(l *load, lim *tollgate.Limiter, c call) (ok bool) {
	lost := l.canary.lost.Load()
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			w.mu.Lock()
			w.panics = append(w.panics, fmt.Sprintf("%v\n%s", p, debug.Stack()))
			w.mu.Unlock()
			ok = false
		}
	}()
	res, err := lim.AllowN(context.Background(), c.key, c.limit, c.n)
	end := time.Now()
	d := end.Sub(start)
	own := d - time.Duration(l.canary.lost.Load()-lost)

	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls++
	w.maxDur = max(w.maxDur, d)
	w.maxOwn = max(w.maxOwn, own)
	if own > deadline+margin {
		w.late++
	}
	if err != nil {
		w.errs++
		w.errsMarked++
		w.errDurSum += d
		w.errDurMax = max(w.errDurMax, d)
		if w.firstErr.IsZero() {
			w.firstErr = end
		}
		w.lastErr = end
		if c.count {
			w.failed[c.key]++
		}
		class := classify(err)
		if w.classes[class]++; w.classes[class] == 1 {
			w.samples[class] = err.Error()
		}
		return true
	}
	w.lastOK = end
	if !w.firstErr.IsZero() && w.okAfter.IsZero() {
		w.okAfter = end
	}
	if res.Allowed {
		w.allowed++
		if c.count {
			w.admitted[c.key] += c.n
		}
	}
	return true
}

// mark forgets when decisions failed and succeeded so far, so that the
// next summary's firstErr and recovered describe only what happens from
// now on (a fault), not the warm-up. Counts are kept.
func (l *load) mark() {
	for _, w := range l.workers {
		w.mu.Lock()
		w.firstErr, w.okAfter, w.errsMarked = time.Time{}, time.Time{}, 0
		w.mu.Unlock()
	}
}

// stop stops the goroutines and waits for them. It is idempotent.
func (l *load) stop() {
	select {
	case <-l.stopped:
	default:
		close(l.stopped)
	}
	l.wg.Wait()
}

// summary is every worker's record merged.
type summary struct {
	calls, errs, allowed, late int
	errsMarked                 int // failed calls since the last mark
	// byLim counts failed calls since the last mark per Limiter (for
	// limiters(...): plain, pipelined).
	byLim  []int
	maxDur time.Duration
	// maxOwn is the longest call once the stalls of the process during
	// it are taken off: what the call itself took.
	maxOwn                time.Duration
	errDurMean, errDurMax time.Duration
	// firstErr is when the first failed call since the last mark
	// returned, in any goroutine, and lastErr when the last one did.
	firstErr, lastErr time.Time
	// recovered is when the last goroutine to succeed again after its
	// first failure since the mark did; zero while any goroutine that
	// failed has not. recovered - firstErr is the gap the clients saw.
	recovered time.Time
	// allOKSince is the earliest time every goroutine has had a successful
	// call since: the minimum of their last successes.
	allOKSince time.Time
	admitted   map[string]int // cost admitted per key, by counted calls
	failed     map[string]int // failed decisions per key, by counted calls
	classes    map[string]int
	samples    map[string]string
	panics     []string
	// stall is the longest a sleeping goroutine of the process woke late.
	stall time.Duration
}

func (l *load) summary() summary {
	s := summary{classes: map[string]int{}, samples: map[string]string{}, admitted: map[string]int{}, failed: map[string]int{},
		byLim: make([]int, len(l.lims))}
	stillFailing := false
	for i, w := range l.workers {
		w.mu.Lock()
		s.calls += w.calls
		s.errs += w.errs
		s.errsMarked += w.errsMarked
		s.byLim[w.lim] += w.errsMarked
		s.allowed += w.allowed
		s.late += w.late
		s.maxDur = max(s.maxDur, w.maxDur)
		s.maxOwn = max(s.maxOwn, w.maxOwn)
		s.errDurMean += w.errDurSum
		s.errDurMax = max(s.errDurMax, w.errDurMax)
		if !w.firstErr.IsZero() {
			if s.firstErr.IsZero() || w.firstErr.Before(s.firstErr) {
				s.firstErr = w.firstErr
			}
			if w.okAfter.IsZero() {
				stillFailing = true
			} else if w.okAfter.After(s.recovered) {
				s.recovered = w.okAfter
			}
		}
		if w.lastErr.After(s.lastErr) {
			s.lastErr = w.lastErr
		}
		if i == 0 || w.lastOK.Before(s.allOKSince) {
			s.allOKSince = w.lastOK
		}
		for k, n := range w.admitted {
			s.admitted[k] += n
		}
		for k, n := range w.failed {
			s.failed[k] += n
		}
		for c, n := range w.classes {
			s.classes[c] += n
			if _, ok := s.samples[c]; !ok {
				s.samples[c] = w.samples[c]
			}
		}
		s.panics = append(s.panics, w.panics...)
		w.mu.Unlock()
	}
	if s.errs > 0 {
		s.errDurMean /= time.Duration(s.errs)
	}
	l.canary.mu.Lock()
	s.stall = l.canary.worst
	l.canary.mu.Unlock()
	if stillFailing {
		s.recovered = time.Time{}
	}
	return s
}

// waitAllOK waits until every goroutine has had a successful call that
// returned after since, or ctx ends; it returns the summary at that moment.
func (l *load) waitAllOK(ctx context.Context, since time.Time) (summary, error) {
	for {
		s := l.summary()
		if !s.allOKSince.IsZero() && s.allOKSince.After(since) {
			return s, nil
		}
		if len(s.panics) > 0 {
			return s, fmt.Errorf("a decision panicked:\n%s", s.panics[0])
		}
		select {
		case <-ctx.Done():
			return s, fmt.Errorf("not every goroutine has succeeded since %v: %w", since.Format(time.StampMicro), ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// String reports a summary for test logs.
func (s summary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d calls, %d allowed, %d failed", s.calls, s.allowed, s.errs)
	if len(s.byLim) == 2 && s.errsMarked > 0 {
		fmt.Fprintf(&b, " (%d since the fault: %d plain, %d pipelined)", s.errsMarked, s.byLim[0], s.byLim[1])
	}
	if s.errs > 0 {
		fmt.Fprintf(&b, " (mean %v, max %v each)", s.errDurMean.Round(time.Microsecond), s.errDurMax.Round(time.Microsecond))
	}
	fmt.Fprintf(&b, "; slowest call %v (%v without the process's stalls; the worst stall %v)",
		s.maxDur.Round(time.Microsecond), s.maxOwn.Round(time.Microsecond), s.stall.Round(time.Microsecond))
	for _, c := range slices.Sorted(maps.Keys(s.classes)) {
		fmt.Fprintf(&b, "\n  %6d × %s, e.g. %s", s.classes[c], c, s.samples[c])
	}
	return b.String()
}

// check fails t if any decision panicked, returned an error that no
// failure of Redis should cause — CROSSSLOT (the keys of one decision in two
// slots), a malformed reply, a rejected request — or took longer than
// deadline + margin once the time the whole process stood still during it
// is taken off: a decision cannot be blamed for time in which nothing ran
// (on a machine shared with other test binaries that happens, for up to
// hundreds of milliseconds; the canary measures it and the log shows it).
func (s summary) check(t *testing.T) {
	t.Helper()
	if s.late > 0 {
		t.Errorf("%d decisions took longer than deadline %v + margin %v, not counting the stalls of the process during them; the worst %v (%v in all)",
			s.late, deadline, margin, s.maxOwn, s.maxDur)
	}
	for _, p := range s.panics {
		t.Errorf("a decision panicked: %s", p)
	}
	for c, sample := range s.samples {
		switch {
		case c == "CROSSSLOT" || strings.Contains(sample, "CROSSSLOT"):
			t.Errorf("%d decisions failed with CROSSSLOT: %s", s.classes[c], sample)
		case strings.Contains(sample, "unexpected reply"):
			t.Errorf("%d decisions got a malformed reply: %s", s.classes[c], sample)
		case c == "invalid request":
			t.Errorf("%d decisions were rejected: %s", s.classes[c], sample)
		}
	}
}

// classify names the kind of failure err is, for counting.
func classify(err error) string {
	msg := err.Error()
	var rerr redis.Error
	switch {
	case errors.Is(err, tollgate.ErrInvalidKey), errors.Is(err, tollgate.ErrInvalidLimit),
		errors.Is(err, tollgate.ErrInvalidCost), errors.Is(err, tollgate.ErrCostExceedsBurst):
		return "invalid request"
	case errors.Is(err, context.DeadlineExceeded):
		return "context deadline exceeded"
	case strings.Contains(msg, "connection refused"):
		return "connection refused"
	case strings.Contains(msg, "connection reset"):
		return "connection reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "EOF"
	case strings.Contains(msg, "i/o timeout"):
		return "i/o timeout"
	case errors.Is(err, redis.ErrPoolTimeout):
		return "pool timeout"
	case errors.As(err, &rerr):
		// A Redis error reply: its first word is its kind (MOVED,
		// CLUSTERDOWN, NOSCRIPT, LOADING, CROSSSLOT, ...).
		kind, _, _ := strings.Cut(rerr.Error(), " ")
		return kind
	}
	return "other"
}
