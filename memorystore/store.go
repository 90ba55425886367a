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
// bounded: at most WithMaxKeys keys, each a 64-byte entry in its shard's
// table, which is kept between a quarter and half full (128 to 256 bytes a
// key), plus the bytes of a key longer than 16 (a shorter one is kept in
// its entry) and 8 bytes per admitted request a sliding window log
// remembers. On a store whose tables take 8 MiB or more, the
// shards' tables of one size are allocated together, in one block, once
// half the shards need one of that size, and every shard then moves into
// it, the other half a little early: the tables take about 256 bytes a key
// then, and the smaller tables they leave are garbage for the next
// collection. A key whose state is back to full is equivalent to a fresh
// one and, once the store is half full, is reclaimed as new keys arrive;
// when every key is live and the store is full, the key nearest to expiring
// among a few sampled is evicted (it forgets what it spent) and counted in
// Stats.
package memorystore

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/store/exact"
	"github.com/tollgate/tollgate/internal/store/lentkeys"
)

// A Store copies every key it keeps (place), so a door may lend it keys.
func init() {
	lentkeys.Register(func(s tollgate.Store) bool { _, ok := s.(*Store); return ok })
}

// Store is an in-memory tollgate.Store. Create it with New; it is safe for
// concurrent use.
type Store struct {
	permits  *permitTable // the concurrency limits, apart from the rate limits
	shards   []shard
	shift    uint             // a hash's top bits pick its shard: hash >> shift
	seed     maphash.Seed     // the hash of a key longer than inlineKey
	seeds    [4]uint64        // the hash of a shorter one: see hashKey
	now      func() time.Time // nil: the monotonic clock below
	start    time.Time        // when New ran, with its monotonic reading
	startUS  int64            // start in µs since the Unix epoch
	perShard int
	// blocks hands out the shards' tables: see table.
	blocks struct {
		mu    sync.Mutex
		block []entry // a table of size entries for each shard, in order
		size  int
		asked map[int]int // shards that asked for a table of a size above size
		// moving is set when a new block awaits the shards that have not
		// asked for it yet: see move.
		moving atomic.Bool
	}
	// limits remembers the Params of the limits this store decides under,
	// as tollgate.CheckRequest does, but read in place: a decision that
	// finds its limit here neither copies the Params (88 bytes) nor makes
	// another call, which took a tenth of a decision's own time. Each limit
	// has two slots to choose from and takes an empty one; a slot once
	// taken is never reused, so limits that share slots never alternate in
	// them (which would allocate on every call). A limit that finds both of
	// its slots taken by others is checked by tollgate.CheckRequest every
	// time: slower, still exact.
	limits [64]atomic.Pointer[checked]
}

// checked is a valid limit and its Params, never changed once stored.
type checked struct {
	limit tollgate.Limit
	p     tollgate.Params
}

// slots returns the two slots of limits that limit may take.
func (s *Store) slots(limit *tollgate.Limit) (one, two *atomic.Pointer[checked]) {
	h := uint64(limit.Rate)*0x9e3779b97f4a7c15 ^ uint64(limit.Period)*0xc2b2ae3d27d4eb4f ^
		uint64(limit.Burst)*0x165667b19e3779f9 ^ uint64(limit.MaxDelay) ^ uint64(limit.Algorithm) ^
		uint64(len(limit.Calendar.Zone))<<40
	h ^= h >> 29
	const mask = uint64(len(s.limits) - 1)
	return &s.limits[h&mask], &s.limits[h>>58&mask]
}

// known returns the remembered Params of limit, or nil. It compares the
// fields one by one, in line: comparing the structs calls a function.
func (s *Store) known(limit *tollgate.Limit) *tollgate.Params {
	one, two := s.slots(limit)
	if c := one.Load(); c != nil && c.holds(limit) {
		return &c.p
	}
	if c := two.Load(); c != nil && c.holds(limit) {
		return &c.p
	}
	return nil
}

// holds reports whether c is limit's. Most limits have no calendar: two
// empty ones are compared by their lengths alone, without the call that
// compares strings.
func (c *checked) holds(limit *tollgate.Limit) bool {
	a, b := &c.limit.Calendar, &limit.Calendar
	return c.limit.Rate == limit.Rate && c.limit.Period == limit.Period && c.limit.Burst == limit.Burst &&
		c.limit.MaxDelay == limit.MaxDelay && c.limit.Algorithm == limit.Algorithm &&
		len(a.Unit) == len(b.Unit) && len(a.Zone) == len(b.Zone) && (len(a.Unit)+len(a.Zone) == 0 || *a == *b)
}

// check validates a request as tollgate.CheckRequest does and returns the
// limit's Params: remembered ones, or else in *spare. (A valid request
// under a remembered limit is answered in line, by known.)
func (s *Store) check(key string, limit *tollgate.Limit, n int, spare *tollgate.Params) (*tollgate.Params, error) {
	var err error
	if *spare, err = tollgate.CheckRequest(key, *limit, n); err != nil {
		return nil, err
	}
	if p := s.known(limit); p != nil {
		return p, nil
	}
	one, two := s.slots(limit)
	if one.Load() == nil || two.Load() == nil {
		c := &checked{limit: *limit, p: *spare}
		if one.CompareAndSwap(nil, c) || two.CompareAndSwap(nil, c) {
			return &c.p, nil
		}
	}
	return spare, nil
}

var _ tollgate.Settler = (*Store)(nil)

// Option configures a Store.
type Option func(*options)

// options are what the Options set.
type options struct {
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
// A key's state expires when it is back to full under the limit of the
// last call that set its expiry, to the microsecond, and from then on
// decides as no state under any limit; a call that finds it so forgets it.
// Once the store is half full it also reclaims expired states when new
// keys arrive, at the new key's time: if now then steps back behind a
// reclaimed state's expiry, that key starts afresh where it would otherwise
// have found its state again. The monotonic clock never steps back.
func WithClock(now func() time.Time) Option {
	return func(o *options) { o.now = now }
}

// WithMaxKeys bounds how many keys the store holds (default 1,000,000): the
// keys of rate limits, and apart from them, the keys of concurrency limits.
func WithMaxKeys(n int) Option {
	return func(o *options) { o.maxKeys = n }
}

// WithShards sets how many independently locked shards the keys are spread
// over, rounded up to a power of two (default 256).
func WithShards(n int) Option {
	return func(o *options) { o.shards = n }
}

// newOptions applies opts to the defaults and returns them with the number
// of shards: WithShards rounded up to a power of two.
func newOptions(opts []Option) (options, int) {
	c := options{maxKeys: 1_000_000, shards: 256}
	for _, o := range opts {
		o(&c)
	}
	n := 1
	for n < c.shards {
		n <<= 1
	}
	return c, n
}

// New returns an empty Store.
func New(opts ...Option) *Store {
	c, n := newOptions(opts)
	s := &Store{
		permits:  newPermitTable(c, n),
		shards:   make([]shard, n),
		shift:    uint(64 - bits.TrailingZeros(uint(n))),
		seed:     maphash.MakeSeed(),
		now:      c.now,
		start:    time.Now(),
		perShard: max(1, (c.maxKeys+n-1)/n),
	}
	s.startUS = s.start.UnixMicro()
	for i := range s.seeds {
		s.seeds[i] = rand.Uint64()
	}
	for i := range s.shards {
		s.shards[i].index = i
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
func (s *Store) AllowN(ctx context.Context, key string, limit tollgate.Limit, n int) (r tollgate.Result, err error) {
	// The Result is filled in place, field by field, in the frame that
	// returns it: each copy of its eleven words is a score of
	// instructions.
	r.Limit = limit
	_, err = s.decideAt(ctx, &r, key, &limit, n)
	return r, err
}

// ReserveN implements tollgate.Settler: AllowN's decision, and the store's
// clock it was made at.
func (s *Store) ReserveN(ctx context.Context, key string, limit tollgate.Limit, n int) (tollgate.Result, int64, error) {
	r := tollgate.Result{Limit: limit}
	now, err := s.decideAt(ctx, &r, key, &limit, n)
	return r, now, err
}

// decideAt makes AllowN's decision into r, which holds the limit, and
// returns the store's clock it was made at.
func (s *Store) decideAt(ctx context.Context, r *tollgate.Result, key string, limit *tollgate.Limit, n int) (int64, error) {
	// A valid request under a remembered limit, the common case, is
	// checked in line; anything else by check, with its Params in spare.
	p := s.known(limit)
	if p == nil || len(key) == 0 || len(key) > tollgate.MaxKeyLen || n < 0 || int64(n) > p.Capacity {
		var (
			spare tollgate.Params
			err   error
		)
		if p, err = s.check(key, limit, n, &spare); err != nil {
			return s.clock(), fmt.Errorf("memorystore: %w", err)
		}
	}
	kind := kindOf(p)
	h, sh := s.locate(key, kind)
	// On a store of many keys the key's entry is seldom in the CPU's
	// caches: its fetch starts here and runs while the clock is read and
	// the shard locked, which would otherwise each wait for the one
	// before.
	sh.prefetch(h)
	now := s.clock()
	if now < 0 || now > exact.MaxNow || ctx.Err() != nil {
		return now, s.usable(ctx, now)
	}
	if p.Calendar != nil {
		// The algorithms find the window again, in its cache.
		if _, err := p.Calendar.Window(now); err != nil {
			return now, fmt.Errorf("memorystore: %w", err)
		}
	}

	var d decision
	sh.mu.Lock()
	s.decide(&d, sh, h, kind, key, p, now, int64(n))
	sh.mu.Unlock()
	if s.blocks.moving.Load() {
		s.move()
	}
	d.fill(r)
	return now, nil
}

// usable reports why the store cannot decide now: a canceled context, or a
// clock outside what the algorithms count exactly.
func (s *Store) usable(ctx context.Context, now int64) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memorystore: %w", err)
	}
	if now < 0 || now > exact.MaxNow {
		return fmt.Errorf("memorystore: clock reads %v, outside what the store can count exactly (1970 to 2250)", time.UnixMicro(now).UTC())
	}
	return nil
}

// fill writes d into r.
func (d *decision) fill(r *tollgate.Result) {
	r.Allowed = d.allowed
	r.Remaining = int(d.remaining)
	r.RetryAfter = time.Duration(d.retry) * time.Microsecond
	r.ResetAfter = time.Duration(d.reset) * time.Microsecond
	r.Delay = time.Duration(d.delay) * time.Microsecond
}

// result is d as a Result under limit.
func (d *decision) result(limit tollgate.Limit) tollgate.Result {
	return tollgate.Result{
		Allowed:    d.allowed,
		Limit:      limit,
		Remaining:  int(d.remaining),
		RetryAfter: time.Duration(d.retry) * time.Microsecond,
		ResetAfter: time.Duration(d.reset) * time.Microsecond,
		Delay:      time.Duration(d.delay) * time.Microsecond,
	}
}

// SettleN implements tollgate.Settler: it corrects key's state by actual −
// reserved at the store's clock, as the Settler doc says for each
// algorithm, and returns the state as a look (n = 0) then reports it. A
// settle that changes nothing (actual equal to reserved, or a refund that
// finds no state or no window or entries of the reservation's) is that
// look, and sets the state's expiry only as a look does.
func (s *Store) SettleN(ctx context.Context, key string, limit tollgate.Limit, at int64, reserved, actual int) (tollgate.Result, error) {
	now := s.clock()
	p, delta, err := tollgate.CheckSettle(key, limit, at, reserved, actual)
	if err != nil {
		return tollgate.Result{Limit: limit}, fmt.Errorf("memorystore: %w", err)
	}
	if err := s.usable(ctx, now); err != nil {
		return tollgate.Result{Limit: limit}, err
	}
	kind := kindOf(&p)
	h, sh := s.locate(key, kind)

	var d decision
	sh.mu.Lock()
	s.settle(&d, sh, h, kind, key, &p, now, at, delta)
	sh.mu.Unlock()
	if s.blocks.moving.Load() {
		s.move()
	}
	return d.result(limit), nil
}

// settle corrects key's entry in sh (locked) by delta and reports the
// state after it into d.
func (s *Store) settle(d *decision, sh *shard, h, kind uint64, key string, p *tollgate.Params, now, at, delta int64) {
	i := sh.find(h, kind, key)
	if delta == 0 || delta < 0 && (i < 0 || sh.tab[i].expires <= now) {
		s.decide(d, sh, h, kind, key, p, now, 0) // nothing to correct: a look
		return
	}
	if i < 0 {
		i = s.insert(sh, h, kind, key, now)
	}
	e := &sh.tab[i]
	var log *ring
	if p.Algorithm == tollgate.SlidingWindowLog {
		log = sh.log(e)
	}
	if !settleOn(&e.state, log, e.expires <= now, p, now, at, delta) {
		s.decide(d, sh, h, kind, key, p, now, 0)
		return
	}
	decideOn(d, &e.state, log, false, p, now, 0)
	e.expires = now + d.reset
	if d.reset == 0 {
		e.expires = 0 // full: it expires now, also for a clock that steps back
	}
}

// decide makes one decision on key's entry in sh (locked) into d.
func (s *Store) decide(d *decision, sh *shard, h, kind uint64, key string, p *tollgate.Params, now, n int64) {
	i := sh.find(h, kind, key)
	if i < 0 {
		if n == 0 { // looking at a fresh key stores nothing
			var (
				fresh state
				log   ring
			)
			decideOn(d, &fresh, &log, true, p, now, 0)
			return
		}
		i = s.insert(sh, h, kind, key, now)
	}
	e := &sh.tab[i]
	// An expired state decides as a fresh one, under any limit: it is full
	// under the limit that set its expiry, which may not be this call's (a
	// token bucket full under a lower burst is not full under a higher
	// one). A new entry's expires is 0: it is fresh.
	live := e.expires > now
	// decideOn's switch, in line: one frame less on every decision.
	switch p.Algorithm {
	case tollgate.GCRA:
		gcra(d, &e.state, !live, p, now, n)
	case tollgate.FixedWindow:
		fixedWindow(d, &e.state, !live, p, now, n)
	case tollgate.SlidingWindowLog:
		slidingWindowLog(d, sh.log(e), !live, p, now, n)
	case tollgate.SlidingWindowCounter:
		slidingWindowCounter(d, &e.state, !live, p, now, n)
	case tollgate.LeakyBucket:
		leakyBucket(d, &e.state, !live, p, now, n)
	default:
		tokenBucket(d, &e.state, !live, p, now, n)
	}
	switch {
	case d.write || live && d.reset > 0:
		// Kept until it is full under the limit of the last call that saw
		// it, to the µs (Redis keeps it to the ms above, when it decides as
		// no state). A denial or a look sets it too (only it), so a state
		// kept under another limit outlives the RetryAfter this call
		// reports.
		e.expires = now + d.reset
	case !live:
		// Seen expired, it is gone, as a Redis key is: a clock that steps
		// back behind its expiry must not find it again.
		e.expires = 0
	}
}

// insert adds a new, empty entry for key to sh (locked) and returns its
// index. A fresh key always spends what it asks (a cost is never above
// what a full state admits), so the entry is always written.
//
// Once the shard is half full, each insertion looks at a few keys from the
// new key's slot on (its hash puts that at a random place): expired ones
// are reclaimed, and when the shard is full the sampled key nearest to
// expiry is evicted. The cost is constant per new key, never a sweep of
// the whole store; below half full it is nothing, and an expired key that
// returns finds its state where it left it.
func (s *Store) insert(sh *shard, h, kind uint64, key string, now int64) int {
	if sh.n > 0 && sh.n >= s.perShard/2 {
		s.reclaim(sh, h, now)
	}
	if 2*(sh.n+1) > len(sh.tab) {
		s.grow(sh)
	}
	return sh.place(h, kind, key)
}

// reclaim samples a few entries of sh (locked, not empty) from the slot of
// hash h on: it removes the expired ones and, when the shard is still
// full, evicts the live one nearest to expiring.
func (s *Store) reclaim(sh *shard, h uint64, now int64) {
	const samples = 4
	var (
		got    [samples]entry
		k      int
		victim = -1
	)
	// Removing an entry moves others, so the samples are copied first and
	// found again to be removed.
	mask := uint64(len(sh.tab) - 1)
	for i := h & mask; k < samples && k < sh.n; i = (i + 1) & mask {
		if e := &sh.tab[i]; e.kind != 0 {
			got[k] = *e
			k++
		}
	}
	for j := range got[:k] {
		switch g := &got[j]; {
		case g.expires <= now:
			sh.remove(sh.findEntry(g))
		case victim < 0 || g.expires < got[victim].expires:
			victim = j
		}
	}
	if sh.n >= s.perShard && victim >= 0 {
		sh.remove(sh.findEntry(&got[victim]))
		sh.evictions.Add(1)
	}
}

// Reset implements tollgate.Store.
func (s *Store) Reset(ctx context.Context, key string, limit tollgate.Limit) error {
	p, err := tollgate.CheckRequest(key, limit, 0)
	if err != nil {
		return fmt.Errorf("memorystore: %w", err)
	}
	kind := kindOf(&p)
	h, sh := s.locate(key, kind)
	sh.mu.Lock()
	if i := sh.find(h, kind, key); i >= 0 {
		sh.remove(i)
	}
	sh.mu.Unlock()
	return nil
}

// Stats describes a Store's memory.
type Stats struct {
	// Keys is how many keys hold rate-limit state, expired ones not yet
	// reclaimed included.
	Keys int
	// Evictions counts live keys dropped because the store was full. Each
	// one forgot what it had spent: raise WithMaxKeys if this grows.
	Evictions uint64
	// ConcurrencyKeys and ConcurrencyEvictions are the same for the keys
	// of concurrency limits (Acquire): an evicted key's holders keep
	// running, so its limit admits up to max more until their leases end.
	ConcurrencyKeys      int
	ConcurrencyEvictions uint64
}

// Stats returns the store's current Stats.
func (s *Store) Stats() Stats {
	var st Stats
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		st.Keys += sh.n
		sh.mu.Unlock()
		st.Evictions += sh.evictions.Load()
	}
	st.ConcurrencyKeys, st.ConcurrencyEvictions = s.permits.stats()
	return st
}

// StateBytes reports roughly how many bytes key's state under limit holds in
// this store (0 if none): the per-key memory an algorithm costs.
func (s *Store) StateBytes(key string, limit tollgate.Limit) int {
	p, err := limit.Params()
	if err != nil {
		return 0
	}
	kind := kindOf(&p)
	h, sh := s.locate(key, kind)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i := sh.find(h, kind, key)
	if i < 0 {
		return 0
	}
	const overhead = 8 * 8 // the entry itself
	if e := &sh.tab[i]; p.Algorithm == tollgate.SlidingWindowLog && e.a > 0 {
		return overhead + sh.logs[e.a-1].bytes()
	}
	return overhead
}

// expiry returns when key's state under limit expires (for tests).
func (s *Store) expiry(key string, limit tollgate.Limit) (time.Time, bool) {
	p, _ := limit.Params()
	kind := kindOf(&p)
	h, sh := s.locate(key, kind)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i := sh.find(h, kind, key)
	if i < 0 {
		return time.Time{}, false
	}
	return time.UnixMicro(sh.tab[i].expires), true
}
