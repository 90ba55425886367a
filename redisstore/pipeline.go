package redisstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
)

// WithPipeline makes the store gather concurrent decisions and send them to
// Redis together, as one pipeline, instead of one round trip each; a store
// on a *redis.Client does so by default, as WithPipeline(time.Millisecond,
// 64). A decision made while nothing is in flight goes at once, alone: an
// idle store adds no latency. (When its context has a deadline and the
// client ends a call there — go-redis's ContextTimeoutEnabled — it goes
// from the caller's goroutine, exactly as without pipelining; otherwise from
// a goroutine of its own, so that the caller can leave when its context
// ends.) Decisions made while a round trip is in flight are gathered, and
// the batch goes when that round trip returns, when it reaches maxBatch
// decisions, or when its first decision has waited window, whichever comes
// first; so under load each round trip carries what arrived during the last
// one, and window only bounds the wait behind a slow round trip.
//
// On a single server, a pipeline's decisions of one algorithm go as one
// script call that decides them in order (see WithBatching, which can turn
// this off, and says why a Cluster's do not). Each
// decision is still atomic, as the whole script is, and gets its own reply
// or its own error: the same reply as without pipelining, so pipelining
// changes how many round trips and script calls the decisions take, never
// what they decide. Only the server's clock is read once for a script call
// instead of once a decision.
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
//   - A decision's context still bounds it: a gathered caller whose context
//     ends returns ctx.Err() at once, even while its batch is in flight (the
//     script may still run in Redis, as it may when an unpipelined call is
//     cancelled after it was sent). The batch itself runs under the latest
//     deadline of its callers, or none if one of them has none. A decision
//     sent alone from its caller's goroutine is bounded by its context's
//     deadline, as unpipelined.
//   - A server that has not seen a script (NOSCRIPT, e.g. after a restart or
//     on a new Cluster master) gets the batch's missing scripts by EVAL in a
//     second pipeline, after which they are cached; Load avoids even that.
//   - On a Cluster, go-redis splits the pipeline by node and follows MOVED
//     and ASK; every key is still one slot.
//
// The store starts no goroutine of its own that outlives the decisions in
// flight — a batch is sent from a short-lived goroutine that ends with its
// reply — so there is nothing to close. The callers' context values (for
// tracing hooks, say) reach a decision sent alone from its caller's
// goroutine, not a batch's commands.
//
// A window ≤ 0 or a maxBatch below 2 turns pipelining off: each decision is
// then one call, from its caller's goroutine.
func WithPipeline(window time.Duration, maxBatch int) Option {
	return func(o *options) {
		if window <= 0 || maxBatch < 2 {
			o.s.pipe = nil
			return
		}
		o.s.pipe = &pipeliner{window: window, max: maxBatch}
	}
}

// WithBatching(false) makes every decision WithPipeline gathers its own
// script call (EVALSHA) in the pipeline, as before batching existed;
// WithBatching(true), the default, sends a pipeline's decisions of one
// algorithm as one script call. Without WithPipeline it
// changes nothing.
//
// Why batching is the default: a script call costs Redis more than most
// decisions do — reading the command, building the script's KEYS and ARGV,
// calling into Lua, the server's clock — and a batch pays that once. A
// decision in a batch of 64 costs Redis 27% to 38% fewer instructions than
// alone, by algorithm (bench/luacost.sh), and measured against the same
// pipeline unbatched, batches took 17% to 37% less of the server's CPU a
// decision and never gave fewer decisions a second (bench/RESULTS.md).
//
// Batching applies to a *redis.Client (a single server, or Sentinel
// failover). On a Cluster every decision stays its own call: a script call
// of several keys in one slot is answered TRYAGAIN while that slot
// migrates, and go-redis v9.23's pipeline retry of it writes one command
// from two goroutines at once (the race detector shows it in every run of
// internal/test/faulttest's resharding test with Cluster batches). The same
// holds for any other client, such as a *redis.Ring.
func WithBatching(on bool) Option {
	return func(o *options) { o.s.noBatch = !on }
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
	// batching sends each group of calls (see group) as one script call.
	batching bool
	// fn is the store's: whether to call functions instead of scripts.
	fn *atomic.Bool
	// one is the store's call of one decision on its own (Store.run), and
	// direct says whether a decision with a deadline made while nothing is
	// in flight is made by one, from its caller's goroutine: when the
	// client ends a call at its context's deadline (see deadlineBound).
	one    func(ctx context.Context, alg tollgate.Algorithm, key string, args []any) (any, error)
	direct bool

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
	_, bounded := ctx.Deadline()
	p.mu.Lock()
	if p.inflight < maxInflight && p.direct && bounded {
		// Nothing is in flight, so nothing is gathered (see done): make this
		// decision here and now, as a store without pipelining would, under
		// the caller's own context; then send what arrived meanwhile.
		p.inflight++
		p.mu.Unlock()
		reply, err := p.one(ctx, alg, key, args)
		if next := p.done(); next != nil {
			go p.send(next)
		}
		return reply, err
	}
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

// deadlineBound reports whether client ends a call at its context's
// deadline (go-redis's ContextTimeoutEnabled); without it go-redis waits for
// its read timeout, and a pipelined decision is sent from a goroutine of its
// own so that its caller can leave at its deadline.
func deadlineBound(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return false
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
		b = p.done()
	}
}

// done ends a round trip: it takes the batch gathered meanwhile, if any, as
// the next to send, and returns it.
func (p *pipeliner) done() *batch {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inflight--
	next := p.cur
	if next != nil {
		p.take(next)
	}
	return next
}

// exec runs b's decisions as one pipeline of FCALL or EVALSHA (see
// Store.run) — one per group of decisions that batch together (see group)
// — and those the server answers that it lacks the function or the script
// as a second pipeline of EVAL.
func (p *pipeliner) exec(b *batch) {
	ctx := context.Background()
	if !b.noDeadline {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, b.deadline)
		defer cancel()
	}
	groups := p.group(b.calls)
	keys := make([][]string, len(groups))
	args := make([][]any, len(groups))
	for i, g := range groups {
		keys[i] = make([]string, len(g))
		// Every call of a group has its algorithm's number of arguments:
		// one allocation of the right size, not one per doubling.
		args[i] = make([]any, 0, len(g)*len(b.calls[g[0]].args))
		for j, c := range g {
			keys[i][j] = b.calls[c].key
			args[i] = append(args[i], b.calls[c].args...)
		}
	}
	cmds := make([]*redis.Cmd, len(groups))
	pipe := p.client.Pipeline()
	fn := p.fn != nil && p.fn.Load()
	for i, g := range groups {
		if alg := b.calls[g[0]].alg; fn {
			cmds[i] = pipe.FCall(ctx, fnNames[alg], keys[i], args[i]...)
		} else {
			cmds[i] = pipe.EvalSha(ctx, scripts[alg].Hash(), keys[i], args[i]...)
		}
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error

	var missing []int
	for i, cmd := range cmds {
		err := cmd.Err()
		switch {
		case err == nil:
		case redis.HasErrorPrefix(err, "NOSCRIPT"):
			missing = append(missing, i)
		case fn && isMissingFunction(err):
			p.fn.Store(false)
			missing = append(missing, i)
		}
	}
	if len(missing) > 0 {
		pipe = p.client.Pipeline()
		for _, i := range missing {
			cmds[i] = pipe.Eval(ctx, sources[b.calls[groups[i][0]].alg], keys[i], args[i]...)
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
	for i, g := range groups {
		scatter(b.calls, g, cmds[i])
	}
}

// group splits calls into the groups that go to Redis as one script call
// each, as lists of indexes into calls in the order of the calls. With
// batching off (and on any client but a *redis.Client: see WithBatching),
// every call is a group of its own; otherwise the calls of one algorithm go
// together.
func (p *pipeliner) group(calls []call) [][]int {
	groups := make([][]int, 0, min(len(calls), 8))
	if !p.batching {
		for i := range calls {
			groups = append(groups, []int{i})
		}
		return groups
	}
	heads := make([]tollgate.Algorithm, 0, cap(groups))
next:
	for i := range calls {
		h := calls[i].alg
		for j := range heads {
			if heads[j] == h {
				groups[j] = append(groups[j], i)
				continue next
			}
		}
		heads = append(heads, h)
		groups = append(groups, []int{i})
	}
	return groups
}

// scatter gives each call of group g its reply from cmd, the group's
// script call: the reply itself for a group of one, else the element of
// the batch's array that is the call's, a reply or an error.
func scatter(calls []call, g []int, cmd *redis.Cmd) {
	reply, err := cmd.Result()
	if len(g) == 1 {
		calls[g[0]].reply, calls[g[0]].err = reply, err
		return
	}
	arr, ok := reply.([]any)
	if err == nil && (!ok || len(arr) != len(g)) {
		err = fmt.Errorf("unexpected reply to a batch of %d decisions: %T of length %d", len(g), reply, len(arr))
	}
	for j, i := range g {
		c := &calls[i]
		if err != nil {
			c.err = err
			continue
		}
		if e, ok := arr[j].(error); ok {
			c.err = e
			continue
		}
		c.reply = arr[j]
	}
}
