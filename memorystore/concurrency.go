package memorystore

import (
	"context"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/store/exact"
	"github.com/tollgate/tollgate/internal/store/permit"
)

// permitTable holds a Store's concurrency limits (tollgate.ConcurrencyStore),
// deciding exactly as redisstore does, apart from its rate limits: a key's
// permits and its rate state never meet.
//
// Each key holds a small map of its permits and when each lapses. A call on
// a key first drops the permits that have lapsed by the store's clock, so a
// key holds at most as many permits as the largest max it was called with.
// A key whose permits have all lapsed or been released is gone.
//
// Memory is bounded by WithMaxKeys, as for rate limits and apart from them:
// once a shard is half full,
// each new key reclaims the lapsed keys among a few it samples, and when the
// store is full and every key holds live permits, the sampled key whose last
// permit lapses first is evicted and counted in Stats (ConcurrencyEvictions). An evicted key's
// holders keep running unaware, so its limit admits up to max more until
// their leases would have ended; Renew tells them (ErrPermitExpired). Raise
// WithMaxKeys if evictions happen.
type permitTable struct {
	shards   []concShard
	mask     uint64
	seed     maphash.Seed
	now      func() time.Time
	start    time.Time
	startUS  int64
	perShard int
}

var _ tollgate.ConcurrencyStore = (*Store)(nil)

type concShard struct {
	mu        sync.Mutex
	m         map[string]*permits
	evictions atomic.Uint64
	_         [16]byte // keep neighbouring shards' locks off one cache line
}

// permits are one key's held slots: ID → when it lapses, in µs.
type permits struct {
	exp map[string]int64
	// next is the earliest expiry in exp (or earlier): nothing lapses
	// before it, so a call before it skips the scan.
	next int64
	// last is the latest expiry: the key is gone after it.
	last int64
}

// newPermitTable returns an empty permitTable under c, in n shards.
func newPermitTable(c options, n int) *permitTable {
	s := &permitTable{
		shards:   make([]concShard, n),
		mask:     uint64(n - 1),
		seed:     maphash.MakeSeed(),
		now:      c.now,
		start:    time.Now(),
		perShard: max(1, (c.maxKeys+n-1)/n),
	}
	s.startUS = s.start.UnixMicro()
	for i := range s.shards {
		s.shards[i].m = make(map[string]*permits)
	}
	return s
}

// clock returns the time in µs since the Unix epoch: WithClock's, or the
// monotonic clock anchored to the wall clock when the store was made, so a
// step of the system clock neither ends leases early nor stretches them.
func (s *permitTable) clock() (int64, error) {
	var now int64
	if s.now != nil {
		now = s.now().UnixMicro()
	} else {
		now = s.startUS + int64(time.Since(s.start)/time.Microsecond)
	}
	if now < 0 || now > exact.MaxNow {
		return 0, fmt.Errorf("memorystore: clock reads %v, outside what the store can count exactly (1970 to 2250)", time.UnixMicro(now).UTC())
	}
	return now, nil
}

func (s *permitTable) shard(key string) *concShard {
	return &s.shards[maphash.String(s.seed, key)&s.mask]
}

// Acquire implements tollgate.ConcurrencyStore: concurrency limits for one
// process, deciding exactly as redisstore does. A key's permits are kept
// apart from its rate limits' state.
func (s *Store) Acquire(ctx context.Context, key string, max int, lease time.Duration) (tollgate.Permit, tollgate.ConcurrencyResult, error) {
	return s.permits.acquireNew(ctx, key, max, lease)
}

// AcquireID implements tollgate.ConcurrencyStore.
func (s *Store) AcquireID(ctx context.Context, key, id string, max int, lease time.Duration) (tollgate.Permit, tollgate.ConcurrencyResult, error) {
	return s.permits.acquireID(ctx, key, id, max, lease)
}

// Release implements tollgate.ConcurrencyStore.
func (s *Store) Release(ctx context.Context, p tollgate.Permit) error {
	return s.permits.release(ctx, p)
}

// Renew implements tollgate.ConcurrencyStore.
func (s *Store) Renew(ctx context.Context, p tollgate.Permit, lease time.Duration) (tollgate.Permit, error) {
	return s.permits.renew(ctx, p, lease)
}

func (s *permitTable) acquireNew(ctx context.Context, key string, max int, lease time.Duration) (tollgate.Permit, tollgate.ConcurrencyResult, error) {
	res := tollgate.ConcurrencyResult{Max: max}
	leaseUS, err := permit.CheckAcquire(key, max, lease)
	if err != nil {
		return tollgate.Permit{}, res, fmt.Errorf("memorystore: acquire: %w", err)
	}
	// Drawn before the lock: it reads the system's random source.
	return s.acquire(ctx, key, permit.NewID(), max, leaseUS)
}

func (s *permitTable) acquireID(ctx context.Context, key, id string, max int, lease time.Duration) (tollgate.Permit, tollgate.ConcurrencyResult, error) {
	leaseUS, err := permit.CheckAcquireID(key, id, max, lease)
	if err != nil {
		return tollgate.Permit{}, tollgate.ConcurrencyResult{Max: max}, fmt.Errorf("memorystore: acquire: %w", err)
	}
	return s.acquire(ctx, key, id, max, leaseUS)
}

// acquire takes a slot of key for the permit id, checked.
func (s *permitTable) acquire(ctx context.Context, key, id string, max int, leaseUS int64) (tollgate.Permit, tollgate.ConcurrencyResult, error) {
	res := tollgate.ConcurrencyResult{Max: max}
	if err := ctx.Err(); err != nil {
		return tollgate.Permit{}, res, fmt.Errorf("memorystore: acquire: %w", err)
	}
	now, err := s.clock()
	if err != nil {
		return tollgate.Permit{}, res, err
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ps := sh.live(key, now)
	count := 0
	if ps != nil {
		count = len(ps.exp)
		if e, held := ps.exp[id]; held {
			// The name is taken: one slot per permit.
			res.RetryAfter = time.Duration(e-now) * time.Microsecond
			return tollgate.Permit{}, res, nil
		}
	}
	if count >= max {
		// The count-max+1 earliest leases must end before a slot is free
		// (more than one only after max was lowered).
		res.RetryAfter = time.Duration(ps.nth(count-max)-now) * time.Microsecond
		return tollgate.Permit{}, res, nil
	}
	if ps == nil {
		ps = &permits{exp: make(map[string]int64, 1), next: now + leaseUS}
		s.insert(sh, key, ps, now)
	}
	p := tollgate.Permit{Key: key, ID: id, Expires: time.UnixMicro(now + leaseUS)}
	ps.set(p.ID, now+leaseUS)
	res.Allowed = true
	res.Remaining = max - count - 1
	return p, res, nil
}

// Release implements tollgate.ConcurrencyStore.
func (s *permitTable) release(ctx context.Context, p tollgate.Permit) error {
	if err := permit.Check(p); err != nil {
		return fmt.Errorf("memorystore: release: %w", err)
	}
	now, err := s.clock()
	if err != nil {
		return err
	}
	sh := s.shard(p.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if ps := sh.live(p.Key, now); ps != nil {
		ps.remove(p.ID)
		if len(ps.exp) == 0 {
			delete(sh.m, p.Key)
		}
	}
	return nil
}

// Renew implements tollgate.ConcurrencyStore.
func (s *permitTable) renew(ctx context.Context, p tollgate.Permit, lease time.Duration) (tollgate.Permit, error) {
	if err := permit.Check(p); err != nil {
		return p, fmt.Errorf("memorystore: renew: %w", err)
	}
	leaseUS, err := permit.CheckLease(lease)
	if err != nil {
		return p, fmt.Errorf("memorystore: renew: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return p, fmt.Errorf("memorystore: renew: %w", err)
	}
	now, err := s.clock()
	if err != nil {
		return p, err
	}
	sh := s.shard(p.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ps := sh.live(p.Key, now)
	if ps == nil {
		return p, fmt.Errorf("memorystore: renew: %w", tollgate.ErrPermitExpired)
	}
	if _, ok := ps.exp[p.ID]; !ok {
		return p, fmt.Errorf("memorystore: renew: %w", tollgate.ErrPermitExpired)
	}
	ps.set(p.ID, now+leaseUS)
	p.Expires = time.UnixMicro(now + leaseUS)
	return p, nil
}

// live returns key's permits after dropping those lapsed at now, or nil when
// none is left (sh locked).
func (sh *concShard) live(key string, now int64) *permits {
	ps, ok := sh.m[key]
	if !ok {
		return nil
	}
	if ps.last <= now {
		delete(sh.m, key)
		return nil
	}
	if ps.next <= now {
		next := ps.last
		for id, e := range ps.exp {
			if e <= now {
				delete(ps.exp, id)
			} else {
				next = min(next, e)
			}
		}
		ps.next = next
	}
	return ps
}

// set records that id lapses at exp.
func (ps *permits) set(id string, exp int64) {
	old, renewed := ps.exp[id]
	ps.exp[id] = exp
	ps.next = min(ps.next, exp)
	if exp >= ps.last {
		ps.last = exp
	} else if renewed && old == ps.last {
		// A renewal shortened the latest lease: find the new latest.
		ps.last = exp
		for _, e := range ps.exp {
			ps.last = max(ps.last, e)
		}
	}
}

// remove drops id; last stays an upper bound and is found again when needed.
func (ps *permits) remove(id string) {
	e, ok := ps.exp[id]
	if !ok {
		return
	}
	delete(ps.exp, id)
	if e == ps.last {
		ps.last = 0
		for _, e := range ps.exp {
			ps.last = max(ps.last, e)
		}
	}
}

// nth returns the (i+1)-th earliest expiry (i < len(exp)).
func (ps *permits) nth(i int) int64 {
	if i == 0 {
		// The usual denial, at max: the earliest lease.
		first := ps.last
		for _, e := range ps.exp {
			first = min(first, e)
		}
		return first
	}
	all := make([]int64, 0, len(ps.exp))
	for _, e := range ps.exp {
		all = append(all, e)
	}
	slices.Sort(all)
	return all[i]
}

// insert adds a new key to sh (locked), reclaiming and evicting as Store's
// insert does: below half full it only adds; above, it samples a few keys,
// drops the lapsed ones and, when the shard is full, evicts the sampled key
// whose last lease ends first.
func (s *permitTable) insert(sh *concShard, key string, ps *permits, now int64) {
	if len(sh.m) >= s.perShard/2 {
		const samples = 4
		var (
			victim   string
			earliest int64 = -1
			seen     int
		)
		for k, v := range sh.m {
			if v.last <= now {
				delete(sh.m, k)
			} else if earliest < 0 || v.last < earliest {
				victim, earliest = k, v.last
			}
			if seen++; seen == samples {
				break
			}
		}
		if len(sh.m) >= s.perShard && earliest >= 0 {
			delete(sh.m, victim)
			sh.evictions.Add(1)
		}
	}
	sh.m[key] = ps
}

// stats returns how many keys hold permits (lapsed ones not yet reclaimed
// included) and how many live keys were evicted because the table was full.
func (s *permitTable) stats() (keys int, evictions uint64) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		keys += len(sh.m)
		sh.mu.Unlock()
		evictions += sh.evictions.Load()
	}
	return keys, evictions
}

// held reports the permits key holds as the store last saw them, lapsed
// ones not yet dropped included: how many, and when the last one lapses
// (the zero Time when none). It is what Redis's ZCARD and the key's TTL
// show for redisstore, for tests.
func (s *permitTable) held(key string) (int, time.Time) {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ps, ok := sh.m[key]
	if !ok || len(ps.exp) == 0 {
		return 0, time.Time{}
	}
	return len(ps.exp), time.UnixMicro(ps.last)
}
