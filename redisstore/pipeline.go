package redisstore

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
)

// WithPipeline makes the store gather concurrent decisions and send them to
// Redis together, as one pipeline, instead of one round trip each. A
// decision made while no pipeline is in flight goes at once, alone: an idle
// store adds no latency. Decisions made while a pipeline is in flight are
// gathered, and the batch goes when that pipeline returns, when it reaches
// maxBatch decisions, or when its first decision has waited window,
// whichever comes first; so under load each round trip carries what
// arrived during the last one, and window only bounds the wait behind a
// slow round trip. Each decision is still its own
// EVALSHA — its own atomic script call, with the same reply as without
// pipelining — so pipelining changes how many round trips the decisions
// take, never what they decide.
//
// Why: a Redis core spends most of an unpipelined decision reading and
// writing the network, not running Lua; sent together, the same scripts run
// about twice as often per second, and the client spends a fraction of the
// system calls (see docs/operations.md, "Scale and faults"). A window of a few round
// trips (say 1ms) and a batch of 32 to 128 suit most services; a window
// shorter than a round trip under load sends more, smaller pipelines.
// Measure with the benchmark in bench/.
//
// What stays as without it:
//   - A decision's context still bounds it: a caller whose context ends
//     returns ctx.Err() at once, even while its batch is in flight (the
//     script may still run in Redis, as it may when an unpipelined call is
//     cancelled after it was sent). The batch itself runs under the latest
//     deadline of its callers, or none if one of them has none.
//   - A server that has not seen a script (NOSCRIPT, e.g. after a restart or
//     on a new Cluster master) gets the batch's missing scripts by EVAL in a
//     second pipeline, after which they are cached; Load avoids even that.
//   - On a Cluster, go-redis splits the pipeline by node and follows MOVED
//     and ASK; every key is still one slot.
//
// The store starts no goroutine of its own that outlives the decisions in
// flight — a batch is sent from a short-lived goroutine that ends with its
// reply — so there is nothing to close. The callers' context values (for
// tracing hooks, say) do not reach the batch's commands.
//
// A window ≤ 0 or a maxBatch below 2 leaves pipelining off.
func WithPipeline(window time.Duration, maxBatch int) Option {
	return func(s *Store) {
		if window <= 0 || maxBatch < 2 {
			s.pipe = nil
			return
		}
		s.pipe = &pipeliner{window: window, max: maxBatch}
	}
}

// maxInflight is how many pipelines may be in flight before decisions wait
// to be gathered. One: Redis runs commands one at a time anyway, and what
// arrives during a round trip goes in the next, so batches grow with the
// load by themselves. (Measured on 2 cores: two in flight made batches
// smaller and gained nothing.) A Cluster client's pipeline goes to every
// node at once, so this is one per client, not one per node.
const maxInflight = 1

// pipeliner gathers decisions into batches. The batch being filled is cur.
// It is sent by whoever takes it out of cur under mu, so it is sent once:
// the caller that finds nothing in flight or fills it (from a new
// goroutine), its timer (from the timer's goroutine), or the goroutine of a
// pipeline that has just returned.
type pipeliner struct {
	client redis.UniversalClient
	window time.Duration
	max    int

	mu       sync.Mutex
	cur      *batch
	inflight int // pipelines sent and not yet answered
}

// batch is one pipeline's worth of decisions. Its calls are appended under
// the pipeliner's lock while it is cur, and read and written only by the
// goroutine that sends it afterwards; done is closed once every call has
// its reply.
type batch struct {
	calls      []call
	done       chan struct{}
	timer      *time.Timer
	deadline   time.Time
	noDeadline bool
}

type call struct {
	alg   tollgate.Algorithm
	key   string
	args  []any
	reply any
	err   error
}

// run makes one decision as part of a batch and returns the script's reply.
func (p *pipeliner) run(ctx context.Context, alg tollgate.Algorithm, key string, args []any) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	b := p.cur
	if b == nil {
		b = &batch{calls: make([]call, 0, min(p.max, 64)), done: make(chan struct{})}
		p.cur = b
	}
	i := len(b.calls)
	b.calls = append(b.calls, call{alg: alg, key: key, args: args})
	if d, ok := ctx.Deadline(); !ok {
		b.noDeadline = true
	} else if d.After(b.deadline) {
		b.deadline = d
	}
	now := p.inflight < maxInflight || len(b.calls) >= p.max
	if now {
		p.take(b)
	} else if b.timer == nil {
		b.timer = time.AfterFunc(p.window, func() { p.flush(b) })
	}
	p.mu.Unlock()
	if now {
		go p.send(b)
	}
	select {
	case <-b.done:
		c := &b.calls[i]
		return c.reply, c.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// take makes b, the batch being filled, the next to be sent; called with
// mu held.
func (p *pipeliner) take(b *batch) {
	p.cur = nil
	p.inflight++
	if b.timer != nil {
		b.timer.Stop() // if it fired already, flush finds b gone and does nothing
	}
}

// flush sends b if it is still the batch being filled.
func (p *pipeliner) flush(b *batch) {
	p.mu.Lock()
	if p.cur != b {
		p.mu.Unlock()
		return
	}
	p.take(b)
	p.mu.Unlock()
	p.send(b)
}

// send sends b, wakes its callers, and then sends the batch gathered in the
// meantime, if any, and so on.
func (p *pipeliner) send(b *batch) {
	for b != nil {
		p.exec(b)
		close(b.done)
		p.mu.Lock()
		p.inflight--
		next := p.cur
		if next != nil {
			p.take(next)
		}
		p.mu.Unlock()
		b = next
	}
}

// exec runs b's decisions as one pipeline of EVALSHA, and those the server
// answers NOSCRIPT as a second pipeline of EVAL.
func (p *pipeliner) exec(b *batch) {
	ctx := context.Background()
	if !b.noDeadline {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, b.deadline)
		defer cancel()
	}
	cmds := make([]*redis.Cmd, len(b.calls))
	pipe := p.client.Pipeline()
	for i := range b.calls {
		c := &b.calls[i]
		cmds[i] = pipe.EvalSha(ctx, scripts[c.alg].Hash(), []string{c.key}, c.args...)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error

	var missing []int
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			missing = append(missing, i)
		}
	}
	if len(missing) > 0 {
		pipe = p.client.Pipeline()
		for _, i := range missing {
			c := &b.calls[i]
			cmds[i] = pipe.Eval(ctx, sources[c.alg], []string{c.key}, c.args...)
		}
		_, _ = pipe.Exec(ctx)
	}
	// A Cluster pipeline backs off 10–30 ms before it follows MOVED or ASK;
	// if the deadline ends meanwhile, go-redis gives the context's error
	// only to commands that have none yet, and a redirected one keeps the
	// redirection. A redirection is never the cluster's answer, only an
	// instruction go-redis did not get to follow: report the deadline.
	if err := ctx.Err(); err != nil {
		for _, cmd := range cmds {
			if e := cmd.Err(); redis.HasErrorPrefix(e, "MOVED") || redis.HasErrorPrefix(e, "ASK") {
				cmd.SetErr(err)
			}
		}
	}
	for i, cmd := range cmds {
		b.calls[i].reply, b.calls[i].err = cmd.Result()
	}
}
