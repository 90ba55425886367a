package main

import (
	"context"
	"sync/atomic"
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
// connection they came on, and a call waits at most timeout: then its
// context is cancelled, grpc-go answers it CANCELLED, and its room is
// free. A call stops waiting when its message has been read (the
// interceptors below) or when it ends, however it ends (its context is
// done). A gateway's call sends its message with its headers, so it waits
// microseconds; the bound is met only by clients that hold calls open, and
// while they do, calls past it are refused for everyone — for at most
// timeout.
//
// A call past the bound is refused without the tap's error: grpc-go does
// not release a call it refuses there, and one that asked for a deadline
// (grpc-timeout) keeps its timer, about 450 bytes, until that deadline —
// a client sending "99999999H" with each refused call grew the heap by
// 70 MB for 155,000 of them, for good. Instead the call is let in marked
// refused: answered RESOURCE_EXHAUSTED as soon as its message is read, or
// cancelled after refusedWait if it sends none, and released by grpc-go
// as any call that ends. So a refused call holds its metadata for at most
// refusedWait: what a flood of them holds is what arrives in that time.
type waitingCalls struct {
	max     int64
	timeout time.Duration
	n       atomic.Int64

	gauge   prometheus.GaugeFunc
	stalled *prometheus.CounterVec
	tooMany prometheus.Counter // calls refused past max
	cut     prometheus.Counter // calls cancelled at timeout
}

func newWaitingCalls(max int, timeout time.Duration) *waitingCalls {
	w := &waitingCalls{max: int64(max), timeout: timeout}
	w.gauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tollgate_serve_grpc_waiting_calls",
		Help: "gRPC calls whose headers came and whose request message has not yet been read (at most --grpc-max-waiting-calls).",
	}, func() float64 { return float64(w.n.Load()) })
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
				return arrived(ss.Context())
			}
			return h(srv, &firstMessage{ServerStream: ss})
		}),
	}
}

// waitingKey is the context key of a call's *waitingCall.
type waitingKey struct{}

// refusedWait is how long a call refused past the bound may take to send
// its message and be told so; one that sends none is cancelled then. It
// is far longer than grpc-go takes from the tap to registering the call,
// so that the cancellation never finds it unregistered (grpc-go would then
// drop it without releasing it, as a call the tap refuses).
const refusedWait = 10 * time.Millisecond

// errTooManyWaiting is the answer to a call refused past the bound.
var errTooManyWaiting = status.Error(codes.ResourceExhausted, "too many calls waiting for their request message")

// waitingCall is one call, counted as waiting or refused.
type waitingCall struct {
	w        *waitingCalls
	refused  bool        // past the bound: never counted
	done     atomic.Bool // waits no longer
	timedOut atomic.Bool
	timer    *time.Timer
	stop     func() bool // stops the watch on the call's context
}

// tap counts a call in at its headers, or marks it refused past the bound.
// The context it returns is the call's own from then on: cancelling it, at
// timeout, ends the read of the message.
func (w *waitingCalls) tap(ctx context.Context, _ *tap.Info) (context.Context, error) {
	c := &waitingCall{w: w}
	wait := w.timeout
	if w.n.Add(1) > w.max {
		w.n.Add(-1)
		w.tooMany.Inc()
		c.refused, wait = true, refusedWait
	}
	ctx, cancel := context.WithCancel(ctx)
	c.timer = time.AfterFunc(wait, func() {
		c.timedOut.Store(true)
		cancel()
	})
	// Every way a call ends cancels its context: this uncounts a call
	// that never got to its interceptors (its client went away, its
	// message did not decode).
	c.stop = context.AfterFunc(ctx, c.ended)
	return context.WithValue(ctx, waitingKey{}, c), nil
}

// ended uncounts a call whose context is done before its message came.
func (c *waitingCall) ended() {
	if c.done.CompareAndSwap(false, true) {
		c.timer.Stop()
		if !c.refused {
			c.w.n.Add(-1)
			if c.timedOut.Load() {
				c.w.cut.Inc()
			}
		}
	}
}

// arrived uncounts the call of ctx, whose message has been read (or, for a
// streaming call, may be), and returns errTooManyWaiting when it was
// refused.
func arrived(ctx context.Context) error {
	c, ok := ctx.Value(waitingKey{}).(*waitingCall)
	if !ok {
		return nil
	}
	if c.done.CompareAndSwap(false, true) {
		c.timer.Stop()
		c.stop()
		if !c.refused {
			c.w.n.Add(-1)
		}
	}
	if c.refused {
		return errTooManyWaiting
	}
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
