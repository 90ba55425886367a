package redisstore

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
)

// WithPipeline makes the store gather concurrent decisions and send them to
// Redis together, as one pipeline, instead of one round trip each. The first
// decision of a batch waits up to window for others to join; a batch that
// reaches maxBatch decisions goes at once. Each decision is still its own
// EVALSHA — its own atomic script call, with the same reply as without
// pipelining — so pipelining changes how many round trips the decisions
// take, never what they decide.
//
// Why: a Redis core spends most of an unpipelined decision reading and
// writing the network, not running Lua; sent together, the same scripts run
// about twice as often per second (see README, "Scale and faults"). The cost
// is latency when the store is idle: a lone decision waits window before it
// goes. A window of tens of microseconds and a batch of 16 to 64 suit most
// services; measure with the benchmark in bench/.
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

// pipeliner gathers decisions into batches. The batch being filled is cur;
// it is sent when it is full (by the caller that filled it, from a new
// goroutine) or when its timer fires (from the timer's goroutine), whichever
// comes first: both take it out of cur under mu, so it is sent once.
type pipeliner struct {
	client redis.UniversalClient
	window time.Duration
	max    int

	mu  sync.Mutex
	cur *batch
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
		b.timer = time.AfterFunc(p.window, func() { p.flush(b) })
	}
	i := len(b.calls)
	b.calls = append(b.calls, call{alg: alg, key: key, args: args})
	if d, ok := ctx.Deadline(); !ok {
		b.noDeadline = true
	} else if d.After(b.deadline) {
		b.deadline = d
	}
	full := len(b.calls) >= p.max
	if full {
		p.cur = nil
		b.timer.Stop() // if it fired already, flush finds b gone and does nothing
	}
	p.mu.Unlock()
	if full {
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

// flush sends b if it is still the batch being filled.
func (p *pipeliner) flush(b *batch) {
	p.mu.Lock()
	if p.cur != b {
		p.mu.Unlock()
		return
	}
	p.cur = nil
	p.mu.Unlock()
	p.send(b)
}

// send runs b's decisions as one pipeline of EVALSHA, and those the server
// answers NOSCRIPT as a second pipeline of EVAL, then wakes the callers.
func (p *pipeliner) send(b *batch) {
	defer close(b.done)
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
