// Package memorystore keeps rate-limit state in process memory: the embedded
// default for a single instance, the local tier in front of Redis, and the
// engine of the simulator.
//
// It runs the same six algorithms as redisstore, in the same integer
// arithmetic, so a limit decides identically in memory and in Redis. A limit
// kept here is per process: N replicas each admit the full limit, N times in
// all. Share a limit between replicas with redisstore.
//
// The hot path takes one lock out of many (the key's shard; there is no
// global lock) and allocates nothing for a key that exists. Memory is
// bounded: at most WithMaxKeys keys (about 200 bytes each, plus 8 bytes per
// admitted request a sliding window log remembers). A key whose state is back
// to full is equivalent to a fresh one and, once the store is half full, is
// reclaimed as new keys arrive; when every key is live and the store is full,
// the key nearest to expiring among a few sampled is evicted (it forgets what
// it spent) and counted in Stats.
package memorystore

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/exact"
)

// Store is an in-memory tollgate.Store. Create it with New; it is safe for
// concurrent use.
type Store struct {
	shards   []shard
	mask     uint64
	seed     maphash.Seed
	now      func() time.Time // nil: the monotonic clock below
	start    time.Time        // when New ran, with its monotonic reading
	startUS  int64            // start in µs since the Unix epoch
	perShard int
}

var _ tollgate.Store = (*Store)(nil)

// skey identifies a key's state: as in Redis, one per (key, algorithm,
// period), so several limits on one key do not share a counter.
type skey struct {
	key    string
	alg    tollgate.Algorithm
	period int64
}

type shard struct {
	mu        sync.Mutex
	m         map[skey]*state
	free      []*state // reclaimed states, reused by new keys
	evictions atomic.Uint64
	_         [16]byte // keep neighbouring shards' locks off one cache line
}

// maxFree bounds each shard's list of reclaimed states.
const maxFree = 16

// Option configures a Store.
type Option func(*config)

type config struct {
	now     func() time.Time
	maxKeys int
	shards  int
}

// WithClock makes the store read the time from now: for tests and
// simulations at fixed instants. Without it the store reads the monotonic
// clock, anchored to the wall clock when New ran: a step of the system clock
// (NTP, an operator) neither rewards nor punishes anyone, and a read costs
// one clock call instead of time.Now's two.
//
// A key's state expires when a call on it finds it expired, at that call's
// time. Once the store is half full it also reclaims expired states when
// new keys arrive, at the new key's time: if now then steps back behind a
// reclaimed state's expiry, that key starts afresh where it would otherwise
// have found its state again. The monotonic clock never steps back.
func WithClock(now func() time.Time) Option {
	return func(c *config) { c.now = now }
}

// WithMaxKeys bounds how many keys the store holds (default 1,000,000).
func WithMaxKeys(n int) Option {
	return func(c *config) { c.maxKeys = n }
}

// WithShards sets how many independently locked shards the keys are spread
// over, rounded up to a power of two (default 256).
func WithShards(n int) Option {
	return func(c *config) { c.shards = n }
}

// New returns an empty Store.
func New(opts ...Option) *Store {
	c := config{maxKeys: 1_000_000, shards: 256}
	for _, o := range opts {
		o(&c)
	}
	n := 1
	for n < c.shards {
		n <<= 1
	}
	s := &Store{
		shards:   make([]shard, n),
		mask:     uint64(n - 1),
		seed:     maphash.MakeSeed(),
		now:      c.now,
		start:    time.Now(),
		perShard: max(1, (c.maxKeys+n-1)/n),
	}
	s.startUS = s.start.UnixMicro()
	for i := range s.shards {
		s.shards[i].m = make(map[skey]*state)
	}
	return s
}

// clock returns the time in µs since the Unix epoch.
func (s *Store) clock() int64 {
	if s.now != nil {
		return s.now().UnixMicro()
	}
	return s.startUS + int64(time.Since(s.start)/time.Microsecond)
}

// AllowN implements tollgate.Store.
func (s *Store) AllowN(ctx context.Context, key string, limit tollgate.Limit, n int) (tollgate.Result, error) {
	p, err := tollgate.CheckRequest(key, limit, n)
	if err != nil {
		return tollgate.Result{Limit: limit}, fmt.Errorf("memorystore: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return tollgate.Result{Limit: limit}, fmt.Errorf("memorystore: %w", err)
	}
	now := s.clock()
	if now < 0 || now > exact.MaxNow {
		return tollgate.Result{Limit: limit}, fmt.Errorf("memorystore: clock reads %v, outside what the store can count exactly (1970 to 2250)", time.UnixMicro(now).UTC())
	}
	sk := skey{key: key, alg: limit.Algorithm, period: p.PeriodUS}
	sh := &s.shards[maphash.String(s.seed, key)&s.mask]

	sh.mu.Lock()
	st, ok := sh.m[sk]
	live := ok && st.expires > now
	var d decision
	switch {
	case ok:
		// An expired state decides as a fresh one, as in Redis, which has
		// deleted it by then: the same once the limit changed, too (a
		// token bucket full under a lower burst is not full under a higher
		// one).
		d = decide(st, !live, &p, now, int64(n))
	case n == 0:
		var fresh state // looking at a fresh key stores nothing
		d = decide(&fresh, true, &p, now, 0)
	default:
		st = sh.newState()
		d = decide(st, true, &p, now, int64(n))
		if d.write {
			s.insert(sh, sk, st, now)
		}
	}
	if ok && !live && !d.write {
		// Seen expired, it is gone, as a Redis key is: a clock that steps
		// back behind its expiry must not find it again.
		st.expires = 0
	}
	if d.write || live && d.reset > 0 {
		// Kept until it is full under the limit of the last call that saw
		// it, as long as Redis keeps it: the TTL is whole ms, rounded up. A
		// denial or a look sets it too (only it), so a state kept under
		// another limit outlives the RetryAfter this call reports.
		st.expires = now + max(1, exact.CeilDiv(d.reset, 1000))*1000
	}
	sh.mu.Unlock()

	return tollgate.Result{
		Allowed:    d.allowed,
		Limit:      limit,
		Remaining:  int(d.remaining),
		RetryAfter: time.Duration(d.retry) * time.Microsecond,
		ResetAfter: time.Duration(d.reset) * time.Microsecond,
		Delay:      time.Duration(d.delay) * time.Microsecond,
	}, nil
}

// insert adds a new key to sh (locked). Once the shard is half full, each
// insertion looks at a few keys (Go's map iteration starts at a random
// place): expired ones are reclaimed, and when the shard is full the sampled
// key nearest to expiry is evicted. The cost is constant per new key, never
// a sweep of the whole store; below half full it is nothing (starting a map
// iteration costs more than the rest of a decision), and an expired key that
// returns finds its state where it left it.
func (s *Store) insert(sh *shard, k skey, st *state, now int64) {
	if len(sh.m) < s.perShard/2 {
		sh.m[k] = st
		return
	}
	const samples = 4
	var (
		victim   skey
		earliest int64 = -1
		seen     int
	)
	for sk, v := range sh.m {
		if v.expires <= now {
			delete(sh.m, sk)
			sh.recycle(v)
		} else if earliest < 0 || v.expires < earliest {
			victim, earliest = sk, v.expires
		}
		if seen++; seen == samples {
			break
		}
	}
	if len(sh.m) >= s.perShard && earliest >= 0 {
		sh.recycle(sh.m[victim])
		delete(sh.m, victim)
		sh.evictions.Add(1)
	}
	sh.m[k] = st
}

// newState returns a zero state, reusing a reclaimed one when it can: keys
// that come and go (a client's state expires, it returns) then allocate
// nothing either.
func (sh *shard) newState() *state {
	if n := len(sh.free); n > 0 {
		st := sh.free[n-1]
		sh.free = sh.free[:n-1]
		return st
	}
	return new(state)
}

// recycle keeps a reclaimed state for reuse, zeroed but with its log's
// buffer.
func (sh *shard) recycle(st *state) {
	if len(sh.free) < maxFree {
		*st = state{log: ring{buf: st.log.buf}}
		sh.free = append(sh.free, st)
	}
}

// Reset implements tollgate.Store.
func (s *Store) Reset(ctx context.Context, key string, limit tollgate.Limit) error {
	p, err := tollgate.CheckRequest(key, limit, 0)
	if err != nil {
		return fmt.Errorf("memorystore: %w", err)
	}
	sh := &s.shards[maphash.String(s.seed, key)&s.mask]
	sh.mu.Lock()
	delete(sh.m, skey{key: key, alg: limit.Algorithm, period: p.PeriodUS})
	sh.mu.Unlock()
	return nil
}

// Stats describes a Store's memory.
type Stats struct {
	// Keys is how many keys hold state, expired ones not yet reclaimed
	// included.
	Keys int
	// Evictions counts live keys dropped because the store was full. Each
	// one forgot what it had spent: raise WithMaxKeys if this grows.
	Evictions uint64
}

// Stats returns the store's current Stats.
func (s *Store) Stats() Stats {
	var st Stats
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		st.Keys += len(sh.m)
		sh.mu.Unlock()
		st.Evictions += sh.evictions.Load()
	}
	return st
}

// StateBytes reports roughly how many bytes key's state under limit holds in
// this store (0 if none): the per-key memory an algorithm costs.
func (s *Store) StateBytes(key string, limit tollgate.Limit) int {
	p, err := limit.Params()
	if err != nil {
		return 0
	}
	sh := &s.shards[maphash.String(s.seed, key)&s.mask]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	st, ok := sh.m[skey{key: key, alg: limit.Algorithm, period: p.PeriodUS}]
	if !ok {
		return 0
	}
	const overhead = 8 * 8 // the state struct itself
	return overhead + st.log.bytes()
}

// expiry returns when key's state under limit expires (for tests).
func (s *Store) expiry(key string, limit tollgate.Limit) (time.Time, bool) {
	p, _ := limit.Params()
	sh := &s.shards[maphash.String(s.seed, key)&s.mask]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	st, ok := sh.m[skey{key: key, alg: limit.Algorithm, period: p.PeriodUS}]
	if !ok {
		return time.Time{}, false
	}
	return time.UnixMicro(st.expires), true
}
