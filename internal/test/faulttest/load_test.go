package faulttest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
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
	sched   *metrics.Float64Histogram // scheduling latencies when the load started
	lims    []*tollgate.Limiter       // goroutine g decides with lims[g%len(lims)]
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
	slow       []interval // calls longer than deadline + margin
	errDurSum  time.Duration
	errDurMax  time.Duration
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
	l := &load{lims: lims, stopped: make(chan struct{}), sched: schedLatencies()}
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
// decisions included. It records each stall as an interval, so that a slow
// call can be credited with the stalls that overlapped it — afterwards, in
// summary: a call that ended right after a stall may record its end before
// the canary gets to run.
type canary struct {
	mu     sync.Mutex
	stalls []interval // when the canary should have run and did not
	worst  time.Duration
}

// interval is a span of wall-clock time.
type interval struct{ start, end time.Time }

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
			// A millisecond of lateness is noise; more is a stall.
			if late := now.Sub(last) - tick; late > time.Millisecond {
				c.mu.Lock()
				c.stalls = append(c.stalls, interval{last.Add(tick), now})
				c.worst = max(c.worst, late)
				c.mu.Unlock()
			}
			last = now
		}
	}
}

// overlap returns how much of call the canary saw the process stalled.
func (c *canary) overlap(call interval) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var d time.Duration
	for _, st := range c.stalls {
		lo, hi := st.start, st.end
		if call.start.After(lo) {
			lo = call.start
		}
		if call.end.Before(hi) {
			hi = call.end
		}
		if hi.After(lo) {
			d += hi.Sub(lo)
		}
	}
	return d
}

// schedMax returns a lower bound on the longest time a runnable goroutine
// of the process waited for a CPU since before was read (the
// /sched/latencies histogram of runtime/metrics): the lower edge of the
// highest bucket that gained samples.
func schedMax(before *metrics.Float64Histogram) time.Duration {
	now := schedLatencies()
	for i := len(now.Counts) - 1; i >= 0; i-- {
		if now.Counts[i] > before.Counts[i] {
			return time.Duration(max(0, now.Buckets[i]) * float64(time.Second))
		}
	}
	return 0
}

func schedLatencies() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	return s[0].Value.Float64Histogram()
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

	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls++
	w.maxDur = max(w.maxDur, d)
	if d > deadline+margin {
		w.slow = append(w.slow, interval{start, end})
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
	calls, errs, allowed int
	errsMarked           int // failed calls since the last mark
	// byLim counts failed calls since the last mark per Limiter (for
	// limiters(...): plain, pipelined).
	byLim  []int
	maxDur time.Duration
	// late counts the calls longer than deadline + margin + sched once
	// the stalls the canary saw during them are taken off; maxOwn is the
	// longest such remainder (or the longest call, if none was slow).
	late   int
	maxOwn time.Duration
	// sched is a lower bound on the longest a runnable goroutine waited
	// for a CPU while the load ran.
	sched                 time.Duration
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
	var slow []interval
	for i, w := range l.workers {
		w.mu.Lock()
		s.calls += w.calls
		s.errs += w.errs
		s.errsMarked += w.errsMarked
		s.byLim[w.lim] += w.errsMarked
		s.allowed += w.allowed
		s.maxDur = max(s.maxDur, w.maxDur)
		slow = append(slow, w.slow...)
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
	s.sched = schedMax(l.sched)
	s.maxOwn = s.maxDur
	if len(slow) > 0 {
		s.maxOwn = 0
	}
	for _, c := range slow {
		own := c.end.Sub(c.start) - l.canary.overlap(c)
		s.maxOwn = max(s.maxOwn, own)
		if own > deadline+margin+s.sched {
			s.late++
		}
	}
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
	fmt.Fprintf(&b, "; slowest call %v", s.maxDur.Round(time.Microsecond))
	if s.maxOwn != s.maxDur {
		fmt.Fprintf(&b, " (%v without the process's stalls)", s.maxOwn.Round(time.Microsecond))
	}
	fmt.Fprintf(&b, "; the worst stall %v, the longest wait for a CPU at least %v", s.stall.Round(time.Microsecond), s.sched.Round(time.Microsecond))
	for _, c := range slices.Sorted(maps.Keys(s.classes)) {
		fmt.Fprintf(&b, "\n  %6d × %s, e.g. %s", s.classes[c], c, s.samples[c])
	}
	return b.String()
}

// check fails t if any decision panicked, returned an error that no
// failure of Redis should cause — CROSSSLOT (the keys of one decision in two
// slots), a malformed reply, a rejected request — or took longer than its
// deadline plus margin, once what the process could not help is taken off:
// the stalls the canary saw during the call (the process did not run at
// all: on a machine shared with other test binaries that happens, for up to
// hundreds of milliseconds), and the longest any goroutine waited for a CPU
// (the runtime's own measure). Both are logged; an ignored deadline costs
// seconds, not that.
func (s summary) check(t *testing.T) {
	t.Helper()
	if s.late > 0 {
		t.Errorf("%d decisions took longer than deadline %v + margin %v + the longest wait for a CPU %v, not counting the stalls of the process during them; the worst %v (%v in all)",
			s.late, deadline, margin, s.sched, s.maxOwn, s.maxDur)
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
