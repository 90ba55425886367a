package main

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// waitingCalls bounds the gRPC calls that have sent their headers but not
// yet their request message. grpc-go starts a call, with its metadata
// decoded and a goroutine blocked reading the message, as soon as its
// headers arrive; a client that then sends nothing holds all of it, and
// --grpc-max-concurrent-streams bounds that per connection only: before
// this bound, 60 calls with large metadata took the service from 23 MB to
// 725 MB, and more connections would have taken more.
//
// So at most max calls wait for their message at once, whatever
// connection they came on, and a call waits about timeout at most (up to
// a sweep more): then its context is cancelled, grpc-go answers it
// CANCELLED, and its room is free. A call stops waiting when its message
// has been read (the interceptors below) or when it ends otherwise, which
// the next sweep notices. A gateway's call sends its message with its
// headers, so it waits microseconds; the bound is met only by clients that
// hold calls open, and while they do, calls past it are refused for
// everyone — for a timeout at most.
//
// A call past the bound is refused without the tap's error: grpc-go does
// not release a call it refuses there, and one that asked for a deadline
// (grpc-timeout) keeps its timer, 300 to 450 bytes, until that deadline —
// a client sending "99999999H" with each refused call grew the heap by
// 70 MB for 155,000 of them, for good. Instead the call is let in marked
// refused: answered RESOURCE_EXHAUSTED as soon as its message is read, or
// cancelled after refusedWait if it sends none, and released by grpc-go
// as any call that ends. So a refused call holds its metadata for at most
// refusedWait: what a flood of them holds is what arrives in that time.
//
// The waiting calls are a list in the order they came, swept every
// timeout/10 (at most a second), rather than a timer and a watch on its
// context each: those cost a call 17 allocations and about 7 µs, a
// quarter of the service's own CPU per decision.
type waitingCalls struct {
	max     int
	timeout time.Duration
	sweep   time.Duration
	now     func() time.Time

	mu         sync.Mutex
	head, tail *waitingCall // oldest first
	n          int
	sweeping   bool

	gauge   prometheus.GaugeFunc
	stalled *prometheus.CounterVec
	tooMany prometheus.Counter // calls refused past max
	cut     prometheus.Counter // calls cancelled at timeout
}

// refusedWait is how long a call refused past the bound may take to send
// its message and be told so; one that sends none is cancelled then. It
// is far longer than grpc-go takes from the tap to registering the call,
// so that the cancellation never finds it unregistered (grpc-go would then
// drop it without releasing it, as a call the tap refuses).
const refusedWait = 10 * time.Millisecond

// errTooManyWaiting is the answer to a call refused past the bound.
var errTooManyWaiting = status.Error(codes.ResourceExhausted, "too many calls waiting for their request message")

func newWaitingCalls(max int, timeout time.Duration) *waitingCalls {
	w := &waitingCalls{max: max, timeout: timeout, sweep: min(timeout/10, time.Second), now: time.Now}
	w.gauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tollgate_serve_grpc_waiting_calls",
		Help: "gRPC calls whose headers came and whose request message has not yet been read (at most --grpc-max-waiting-calls).",
	}, func() float64 {
		w.mu.Lock()
		defer w.mu.Unlock()
		return float64(w.n)
	})
	w.stalled = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_serve_grpc_stalled_calls_total",
		Help: "gRPC calls ended for want of their request message: reason too_many (refused, --grpc-max-waiting-calls calls already waiting: answered RESOURCE_EXHAUSTED once its message is read, cancelled if none comes within 10 ms) or timeout (cancelled after --grpc-message-timeout).",
	}, []string{"reason"})
	w.tooMany = w.stalled.WithLabelValues("too_many")
	w.cut = w.stalled.WithLabelValues("timeout")
	return w
}

// register registers the metrics on reg.
func (w *waitingCalls) register(reg prometheus.Registerer) error {
	if err := reg.Register(w.gauge); err != nil {
		return err
	}
	return reg.Register(w.stalled)
}

// options are the server options that apply the bound.
func (w *waitingCalls) options() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InTapHandle(w.tap),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			// A unary call's message is read before its interceptors run.
			if err := arrived(ctx); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if c, ok := ss.Context().Value(waitingKey{}).(*waitingCall); ok && c.refused {
				return errTooManyWaiting
			}
			return h(srv, &firstMessage{ServerStream: ss})
		}),
	}
}

// waitingKey is the context key of a call's *waitingCall.
type waitingKey struct{}

// waitingCall is one call, waiting or refused, and its context from the
// tap on: the call's own, which the sweep can cancel.
type waitingCall struct {
	context.Context
	cancel     context.CancelFunc
	w          *waitingCalls
	refused    bool      // past the bound: never listed
	since      time.Time // when it came
	prev, next *waitingCall
	listed     bool // in the list: under mu
}

// Value gives the call itself for waitingKey.
func (c *waitingCall) Value(key any) any {
	if key == (waitingKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// tap lists a call at its headers, or marks it refused past the bound.
func (w *waitingCalls) tap(ctx context.Context, _ *tap.Info) (context.Context, error) {
	ctx, cancel := context.WithCancel(ctx)
	c := &waitingCall{Context: ctx, cancel: cancel, w: w}
	w.mu.Lock()
	if w.n >= w.max {
		w.mu.Unlock()
		w.tooMany.Inc()
		c.refused = true
		time.AfterFunc(refusedWait, cancel)
		return c, nil
	}
	c.since = w.now()
	c.prev, c.listed = w.tail, true
	if w.tail != nil {
		w.tail.next = c
	} else {
		w.head = c
	}
	w.tail = c
	w.n++
	if !w.sweeping {
		w.sweeping = true
		time.AfterFunc(w.sweep, w.sweepOnce)
	}
	w.mu.Unlock()
	return c, nil
}

// unlist takes c out of the list; w.mu is held.
func (w *waitingCalls) unlist(c *waitingCall) {
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		w.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else {
		w.tail = c.prev
	}
	c.prev, c.next, c.listed = nil, nil, false
	w.n--
}

// sweepOnce takes out of the list the calls that ended without their
// message, cancels those that waited timeout, and comes again while any
// wait.
func (w *waitingCalls) sweepOnce() {
	var late []*waitingCall
	w.mu.Lock()
	now := w.now()
	for c := w.head; c != nil; {
		next := c.next
		switch {
		case c.Err() != nil: // ended: its client went away, its message did not decode
			w.unlist(c)
		case now.Sub(c.since) >= w.timeout:
			w.unlist(c)
			late = append(late, c)
		}
		c = next
	}
	w.sweeping = w.n > 0
	if w.sweeping {
		time.AfterFunc(w.sweep, w.sweepOnce)
	}
	w.mu.Unlock()
	for _, c := range late {
		w.cut.Inc()
		c.cancel()
	}
}

// arrived takes the call of ctx, whose message has been read (or, for a
// streaming call, may be), out of the waiting ones, and returns
// errTooManyWaiting when it was refused.
func arrived(ctx context.Context) error {
	c, ok := ctx.Value(waitingKey{}).(*waitingCall)
	switch {
	case !ok:
		return nil
	case c.refused:
		return errTooManyWaiting
	}
	w := c.w
	w.mu.Lock()
	if c.listed {
		w.unlist(c)
	}
	w.mu.Unlock()
	return nil
}

// firstMessage is a streaming call's stream, which stops waiting at its
// first message.
type firstMessage struct {
	grpc.ServerStream
	got bool
}

func (s *firstMessage) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil && !s.got {
		s.got = true
		arrived(s.Context()) // nil: a refused call never gets here
	}
	return err
}
