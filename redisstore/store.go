// Package redisstore keeps rate-limit state in Redis, so that every replica
// of a service shares one limit.
//
// Each decision is one Lua script call (EVALSHA, falling back to EVAL when
// the server has not seen the script), so it reads, refills, decides and
// writes atomically in one round trip: two replicas can never both spend the
// last token. The scripts live in lua/, one file per algorithm, each with a
// header explaining its keys, arguments, reply and choices; the same
// algorithms run in memorystore with identical results. On Redis 7, Load
// also loads them as one function library, which decisions then call
// (FCALL) for less of the server's time; and WithPipeline sends a
// pipeline's decisions of one algorithm, on a single server, as one call
// that decides them in order, each atomically, each with its own reply.
//
// Time comes from the Redis server (TIME) unless WithClock says otherwise,
// so application clocks do not matter. Every key gets a TTL in the same
// script that writes it and disappears once its state is back to full. A
// key's state lives in one Redis key named
//
//	<prefix>{<key>}:<algorithm>:<period in µs>
//	<prefix>{<key>}:<algorithm>:<unit>@<zone>   (a calendar window)
//
// whose hash tag keeps everything about one caller's key in one Redis
// Cluster slot. Any redis.UniversalClient works: a standalone client,
// Sentinel (failover) or Cluster.
//
// A Store is a tollgate.Settler: ReserveN decides as AllowN does and
// returns the time of the decision (every script's reply ends with it), and
// SettleN corrects a key once a request's real cost is known, by one call
// of lua/settle.lua, atomic like a decision, on the key's one Redis key.
//
// A Store is also a tollgate.ConcurrencyStore: Acquire, Renew and Release
// keep a key's permits in one sorted set, <prefix>{<key>}:conc, one script
// call each (Load preloads those scripts too).
package redisstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/store/exact"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// short names used in Redis keys, by algorithm.
var (
	keyNames = [...]string{
		tollgate.TokenBucket:          "tb",
		tollgate.GCRA:                 "gcra",
		tollgate.FixedWindow:          "fw",
		tollgate.SlidingWindowLog:     "swl",
		tollgate.SlidingWindowCounter: "swc",
		tollgate.LeakyBucket:          "lb",
	}
	sources [len(keyNames)]string
	scripts [len(keyNames)]*redis.Script
	// settleSource and settleScript settle a reservation under any
	// algorithm: lua/lib.lua followed by lua/settle.lua, into which each
	// algorithm's state functions are composed (see composeSettle).
	settleSource string
	settleScript *redis.Script
	// calendarScript decides the windows of a limit with a Calendar:
	// lua/lib.lua followed by lua/calendar.lua.
	calendarScript *redis.Script
	// allScript decides several limits of one key together: lua/lib.lua,
	// every algorithm's decide and the calendar's, and lua/all.lua (see
	// composeAll).
	allSource string
	allScript *redis.Script
)

func init() {
	lib, err := luaFiles.ReadFile("lua/lib.lua")
	if err != nil {
		panic(err) // embedded at build time: cannot happen
	}
	var bodies [len(keyNames)]string
	for _, a := range tollgate.Algorithms() {
		body, err := luaFiles.ReadFile("lua/" + a.String() + ".lua")
		if err != nil {
			panic(err)
		}
		bodies[a] = string(body)
		sources[a] = string(lib) + "\n" + string(body)
		scripts[a] = redis.NewScript(sources[a])
	}
	settle, err := luaFiles.ReadFile("lua/settle.lua")
	if err != nil {
		panic(err)
	}
	settleSource = string(lib) + "\n" + composeSettle(string(settle), bodies)
	settleScript = redis.NewScript(settleSource)
	cal, err := luaFiles.ReadFile("lua/calendar.lua")
	if err != nil {
		panic(err)
	}
	calendarScript = redis.NewScript(string(lib) + "\n" + string(cal))
	all, err := luaFiles.ReadFile("lua/all.lua")
	if err != nil {
		panic(err)
	}
	allSource = composeAll(string(lib), bodies, string(cal), string(all))
	allScript = redis.NewScript(allSource)
	initLibrary(string(lib), bodies, string(settle), string(cal), string(all))
}

// Source returns the Lua source the store runs for algorithm a: lua/lib.lua
// followed by lua/<algorithm>.lua.
func Source(a tollgate.Algorithm) string {
	if int(a) >= len(sources) {
		return ""
	}
	return sources[a]
}

// Store is a tollgate.Store on Redis. It is safe for concurrent use.
type Store struct {
	client redis.UniversalClient
	prefix string
	now    func() time.Time
	// pipe gathers concurrent decisions into pipelines; nil sends each
	// decision on its own.
	pipe *pipeliner
	// noBatch, set by WithBatching(false), keeps each pipelined decision
	// its own script call.
	noBatch bool
	// fn is set once Load has loaded the function library on every server,
	// and cleared when a server lacks it: decisions then call functions
	// (FCALL) instead of scripts.
	fn atomic.Bool
	// edges, when set (tests), is the clock calendar windows' edges are
	// found around instead of the application's, which is the store's
	// clock (WithClock) or else time.Now.
	edges func() time.Time
}

var (
	_ tollgate.Store   = (*Store)(nil)
	_ tollgate.Settler = (*Store)(nil)
)

// Option configures a Store.
type Option func(*options)

// options are what the Options set: the Store being made.
type options struct{ s Store }

// WithPrefix sets the prefix of every key the store writes (default
// "tollgate:"): give two applications sharing a Redis different prefixes.
func WithPrefix(prefix string) Option {
	return func(o *options) { o.s.prefix = prefix }
}

// WithClock makes the scripts use now instead of the Redis server's clock.
// It is for tests and simulations at fixed instants; in production the
// server's clock is what keeps replicas with skewed clocks in agreement.
func WithClock(now func() time.Time) Option {
	return func(o *options) { o.s.now = now }
}

// New returns a Store on client: a *redis.Client, a Sentinel failover
// client, or a *redis.ClusterClient.
//
// On a *redis.Client (one server, or Sentinel failover) the store
// pipelines concurrent decisions as WithPipeline(time.Millisecond, 64)
// does unless told otherwise: a decision made while none is in flight goes
// at once, alone, as without pipelining, and only decisions that arrive
// during a round trip wait for the next, gathered. On any other client
// (a Cluster, a Ring) each decision is its own call unless WithPipeline
// says otherwise (see operations.md, "Scale and faults", for why).
// WithPipeline(0, 0) turns pipelining off.
func New(client redis.UniversalClient, opts ...Option) *Store {
	o := options{s: Store{client: client, prefix: "tollgate:"}}
	_, single := client.(*redis.Client)
	if single {
		WithPipeline(time.Millisecond, 64)(&o) // the default, unless an option says otherwise
	}
	for _, opt := range opts {
		opt(&o)
	}
	s := &o.s
	if s.pipe != nil {
		s.pipe.client = client
		s.pipe.fn = &s.fn
		s.pipe.one = s.run
		s.pipe.direct = deadlineBound(client)
		s.pipe.batching = single && !s.noBatch // see WithBatching
	}
	return s
}

// Key returns the Redis key that holds key's state under limit. A calendar
// window's key ends in its unit and zone instead of the period
// ("…:fw:month@Europe/Berlin"), so it never meets an epoch window's (whose
// period is digits) or another zone's.
func (s *Store) Key(key string, limit tollgate.Limit) string {
	// One allocation, the key's own: the period is formatted on the stack
	// and the builder grown to the exact length, since Key is on every
	// decision's path.
	var num [20]byte
	period := strconv.AppendInt(num[:0], int64(limit.Period/time.Microsecond), 10)
	if limit.Calendar != (tollgate.Calendar{}) {
		period = []byte(limit.Calendar.Unit + "@" + limit.Calendar.Zone)
	}
	alg := ""
	if int(limit.Algorithm) < len(keyNames) {
		alg = keyNames[limit.Algorithm]
	}
	var b strings.Builder
	b.Grow(len(s.prefix) + len(key) + len(alg) + len(period) + 4)
	b.WriteString(s.prefix)
	b.WriteByte('{')
	b.WriteString(key)
	b.WriteString("}:")
	b.WriteString(alg)
	b.WriteByte(':')
	b.Write(period)
	return b.String()
}

// AllowN implements tollgate.Store. Invalid input is rejected before
// anything is sent to Redis.
func (s *Store) AllowN(ctx context.Context, key string, limit tollgate.Limit, n int) (tollgate.Result, error) {
	res, _, err := s.decide(ctx, key, limit, n)
	return res, err
}

// ReserveN implements tollgate.Settler: it decides exactly as AllowN does,
// by the same script call, and also returns the time of the decision in µs
// since the epoch — the Redis server's TIME as the script read it, or the
// WithClock value — which SettleN needs to find the reservation's window or
// log entries.
func (s *Store) ReserveN(ctx context.Context, key string, limit tollgate.Limit, n int) (tollgate.Result, int64, error) {
	return s.decide(ctx, key, limit, n)
}

// decide makes one decision, alone or in a pipeline, and returns its
// Result and the time it was made at (µs).
func (s *Store) decide(ctx context.Context, key string, limit tollgate.Limit, n int) (tollgate.Result, int64, error) {
	p, err := tollgate.CheckRequest(key, limit, n)
	if err != nil {
		return tollgate.Result{Limit: limit}, 0, fmt.Errorf("redisstore: %w", err)
	}
	if p.Calendar != nil {
		return s.decideCalendar(ctx, key, limit, p, n)
	}
	now, err := s.clock()
	if err != nil {
		return tollgate.Result{Limit: limit}, 0, err
	}
	rkey, args := s.Key(key, limit), scriptArgs(p, n, now)
	var reply any
	if s.pipe != nil {
		reply, err = s.pipe.run(ctx, p.Algorithm, rkey, args)
	} else {
		reply, err = s.run(ctx, p.Algorithm, rkey, args)
	}
	return s.result(limit, reply, err)
}

// decideCalendar makes one decision under a calendar window by one call
// of lua/calendar.lua, given the edges of four windows around the
// application's clock (see the script's header): Lua has no time zone
// database. It is sent on its own, never pipelined or batched.
func (s *Store) decideCalendar(ctx context.Context, key string, limit tollgate.Limit, p tollgate.Params, n int) (tollgate.Result, int64, error) {
	args, err := s.calendarArgs(p, n, nil)
	if err != nil {
		return tollgate.Result{Limit: limit}, 0, err
	}
	reply, err := calendarScript.Run(ctx, s.client, []string{s.Key(key, limit)}, args...).Result()
	return s.result(limit, reply, err)
}

// calendarArgs appends to dst the arguments of lua/calendar.lua for the
// checked request p of cost n: the edges of four windows around the
// application's clock, and the time the script decides at ("" for the
// server's).
func (s *Store) calendarArgs(p tollgate.Params, n int, dst []any) ([]any, error) {
	var (
		at  time.Time
		now string // the script's time: "" for the server's
	)
	switch {
	case s.now != nil:
		at = s.now() // the instant the script decides at
		now = strconv.FormatInt(at.UnixMicro(), 10)
	case s.edges != nil:
		at = s.edges()
	default:
		at = time.Now()
	}
	if us := at.UnixMicro(); us < 0 || us > exact.MaxNow {
		return dst, fmt.Errorf("redisstore: clock reads %v, outside what the scripts can count exactly (1970 to 2250)", at)
	}
	w, err := p.Calendar.Window(at.UnixMicro())
	if err != nil {
		return dst, fmt.Errorf("redisstore: %w", err)
	}
	alg := "fw"
	if p.Algorithm == tollgate.SlidingWindowCounter {
		alg = "swc"
	}
	return append(dst, alg, p.Rate, w.Prev, w.Start, w.End, w.Next, w.After, n, now), nil
}

// clock returns the time argument of a script: the WithClock time in µs,
// or "" for the Redis server's.
func (s *Store) clock() (string, error) {
	if s.now == nil {
		return "", nil
	}
	t := s.now().UnixMicro()
	if t < 0 || t > exact.MaxNow {
		return "", fmt.Errorf("redisstore: clock reads %v, outside what the scripts can count exactly (1970 to 2250)", s.now())
	}
	return strconv.FormatInt(t, 10), nil
}

// run makes one decision with one call: to the algorithm's function when
// the library is loaded, else (or when the server lacks the function) to
// its script, by EVALSHA and, if the server lacks that too, EVAL.
func (s *Store) run(ctx context.Context, alg tollgate.Algorithm, rkey string, args []any) (any, error) {
	keys := []string{rkey}
	if s.fn.Load() {
		reply, err := s.client.FCall(ctx, fnNames[alg], keys, args...).Result()
		if err == nil || !isMissingFunction(err) {
			return reply, err
		}
		s.fn.Store(false)
	}
	return scripts[alg].Run(ctx, s.client, keys, args...).Result()
}

// scriptArgs returns the arguments of a decision's script (ARGV) for the
// checked request p of cost n; now is the time in µs, or "" for the
// server's. The arguments that come from the limit are boxed once per
// limit (see argTemplate): one allocation a decision, the slice, instead
// of one for each argument of 256 or more as well.
func scriptArgs(p tollgate.Params, n int, now string) []any {
	var k argKey
	switch p.Algorithm {
	case tollgate.TokenBucket:
		k = argKey{p.Algorithm, 3, [4]int64{p.UnitRate, p.Unit, p.Burst, p.MaxDebt}}
	case tollgate.LeakyBucket:
		k = argKey{p.Algorithm, 3, [4]int64{p.UnitRate, p.Unit, p.Burst, p.MaxDelayUS}}
	case tollgate.GCRA:
		k = argKey{p.Algorithm, 3, [4]int64{p.UnitRate, p.Unit, p.Burst, -1}}
	case tollgate.SlidingWindowCounter:
		k = argKey{p.Algorithm, 3, [4]int64{p.Rate, p.PeriodUS, exact.SlidingGrain(p.PeriodUS), -1}}
	default: // FixedWindow, SlidingWindowLog
		k = argKey{p.Algorithm, 2, [4]int64{p.Rate, p.PeriodUS, -1, -1}}
	}
	slot := &argTemplates[k.slot()]
	t := slot.Load()
	if t == nil {
		t = newArgTemplate(k)
		if !slot.CompareAndSwap(nil, t) {
			t = slot.Load()
		}
	}
	if t.key != k {
		// The slot is another limit's, kept once taken, so that limits
		// that share a slot never take turns replacing each other (which
		// would box every argument on every call): box these here.
		args := newArgTemplate(k).args
		args[k.at], args[k.at+1] = n, now
		return args
	}
	args := make([]any, len(t.args))
	copy(args, t.args)
	args[k.at], args[k.at+1] = n, now
	return args
}

// argKey identifies a limit's script arguments: the algorithm, where n
// goes (now follows it), and the values of the others in order, -1 for
// none.
type argKey struct {
	alg  tollgate.Algorithm
	at   int
	vals [4]int64
}

// slot returns the index of k's entry in argTemplates.
func (k argKey) slot() int {
	h := uint64(k.alg)
	for _, v := range k.vals {
		h = (h ^ uint64(v)) * 0x100000001b3
	}
	return int(h>>32) % len(argTemplates)
}

// argTemplate is a limit's script arguments, boxed, with n and now left
// to fill in. Templates are never changed once stored, only replaced.
type argTemplate struct {
	key  argKey
	args []any
}

// argTemplates holds the templates of the first limits decided under, one
// per slot: a service's limits are few, and a limit whose slot another
// took has its arguments boxed on every call, as without a template.
var argTemplates [64]atomic.Pointer[argTemplate]

func newArgTemplate(k argKey) *argTemplate {
	t := &argTemplate{key: k}
	for _, v := range k.vals {
		if v < 0 {
			break
		}
		if len(t.args) == k.at {
			t.args = append(t.args, nil, nil) // n and now
		}
		t.args = append(t.args, v)
	}
	if len(t.args) == k.at {
		t.args = append(t.args, nil, nil)
	}
	return t
}

// result turns a script's reply, or the error in its place, into the
// decision's Result and the time it was made at.
func (s *Store) result(limit tollgate.Limit, reply any, err error) (tollgate.Result, int64, error) {
	res := tollgate.Result{Limit: limit}
	// Errors name the algorithm, not the key: keys hold client addresses and
	// API keys, and these errors end up in logs.
	if err != nil {
		s.failed(err)
		return res, 0, fmt.Errorf("redisstore: %s: %w", limit.Algorithm, err)
	}
	v, err := parseReply(reply)
	if err != nil {
		return res, 0, fmt.Errorf("redisstore: %s: %w", limit.Algorithm, err)
	}
	res.Allowed = v[0] == 1
	res.Remaining = int(v[1])
	res.RetryAfter = time.Duration(v[2]) * time.Microsecond
	res.ResetAfter = time.Duration(v[3]) * time.Microsecond
	res.Delay = time.Duration(v[4]) * time.Microsecond
	return res, v[5], nil
}

// failed reacts to a failed decision. On a Redis Cluster, go-redis refreshes
// its map of which master owns which slot when a node answers MOVED — which
// a dead master never does — or when the map is older than
// ClusterStateReloadInterval, a minute by default. Without a nudge, the keys
// of a master that died keep going to its address for up to that minute,
// although the cluster promoted a replica within seconds
// (internal/test/faulttest measures both). So a failure that a failover explains
// — a network error, a timeout, CLUSTERDOWN — asks for a reload; go-redis
// runs at most one at a time, 200 ms apart, so a storm of errors costs a
// few CLUSTER SLOTS a second.
func (s *Store) failed(err error) {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return
	}
	var nerr net.Error
	if errors.As(err, &nerr) || errors.Is(err, io.EOF) || errors.Is(err, context.DeadlineExceeded) ||
		strings.HasPrefix(err.Error(), "CLUSTERDOWN") {
		cc.ReloadState(context.Background())
	}
}

// parseReply checks a script's reply: six integers — allowed, remaining,
// retry-after, reset-after, delay, and the time of the decision in µs —
// allowed being 0 or 1, the time at most exact.MaxNow, and none negative.
// Anything else is an error, never a panic.
func parseReply(reply any) ([6]int64, error) {
	var v [6]int64
	arr, ok := reply.([]any)
	if !ok {
		return v, fmt.Errorf("unexpected reply %T, want an array of 6 integers", reply)
	}
	if len(arr) != len(v) {
		return v, fmt.Errorf("unexpected reply of %d elements, want 6 integers", len(arr))
	}
	for i, x := range arr {
		n, ok := x.(int64)
		if !ok {
			return v, fmt.Errorf("unexpected reply: element %d is %T, want an integer", i, x)
		}
		if n < 0 || (i == 0 && n > 1) || (i == 5 && n > exact.MaxNow) {
			return v, fmt.Errorf("unexpected reply: element %d is %d", i, n)
		}
		v[i] = n
	}
	return v, nil
}

// Reset implements tollgate.Store: it deletes key's state under limit.
func (s *Store) Reset(ctx context.Context, key string, limit tollgate.Limit) error {
	if _, err := tollgate.CheckRequest(key, limit, 0); err != nil {
		return fmt.Errorf("redisstore: %w", err)
	}
	if err := s.client.Del(ctx, s.Key(key, limit)).Err(); err != nil {
		return fmt.Errorf("redisstore: reset %s: %w", limit.Algorithm, err)
	}
	return nil
}

// Load loads every script — the decisions', the settle's and the
// concurrency limits' — into the server's script cache (on a Cluster, into
// every master's), so the first calls need no EVAL fallback, and on Redis 7
// the function library (lua/lib.lua, then each algorithm's file and
// lua/settle.lua, each registering its function), which decisions then
// call instead of the scripts. Calling it is optional: a script the server
// lacks is sent once, then cached; without Load the store runs scripts
// only. A server without functions (Redis 6.2) is no error: the store runs
// the scripts there.
func (s *Store) Load(ctx context.Context) error {
	for _, a := range tollgate.Algorithms() {
		if err := scripts[a].Load(ctx, s.client).Err(); err != nil {
			return fmt.Errorf("redisstore: load %s script: %w", a, err)
		}
	}
	if err := settleScript.Load(ctx, s.client).Err(); err != nil {
		return fmt.Errorf("redisstore: load settle script: %w", err)
	}
	if err := calendarScript.Load(ctx, s.client).Err(); err != nil {
		return fmt.Errorf("redisstore: load calendar script: %w", err)
	}
	if err := allScript.Load(ctx, s.client).Err(); err != nil {
		return fmt.Errorf("redisstore: load all script: %w", err)
	}
	for _, sc := range []*redis.Script{concAcquire, concRelease, concRenew} {
		if err := sc.Load(ctx, s.client).Err(); err != nil {
			return fmt.Errorf("redisstore: load concurrency script: %w", err)
		}
	}
	ok, err := s.loadLibrary(ctx)
	if err != nil {
		return fmt.Errorf("redisstore: load function library: %w", err)
	}
	s.fn.Store(ok)
	return nil
}
