package memorystore

import (
	"context"
	"fmt"
	"slices"

	"github.com/tollgate/tollgate"
)

var _ tollgate.Combiner = (*Store)(nil)

// AllowAll implements tollgate.Combiner: n under every one of limits at one
// reading of the clock, spent under all of them or under none.
//
// The limits' states may live in different shards. AllowAll locks each of
// those shards, in the order of the shards (so two calls never wait on each
// other in a cycle), and holds them while it first asks each limit what it
// would decide, on a copy of its state, then decides: n under every limit
// when each would admit it, else n under those that would deny (which
// changes only their expiry, as any denial does) and a look under the
// others.
func (s *Store) AllowAll(ctx context.Context, key string, limits []tollgate.Limit, n int, dst []tollgate.Result) ([]tollgate.Result, error) {
	var pbuf [4]tollgate.Params
	ps, err := tollgate.CheckAll(key, limits, n, pbuf[:0])
	if err != nil {
		return dst, fmt.Errorf("memorystore: %w", err)
	}
	now := s.clock()
	if err := s.usable(ctx, now); err != nil {
		return dst, err
	}
	for i := range ps {
		if c := ps[i].Calendar; c != nil {
			if _, err := c.Window(now); err != nil {
				return dst, fmt.Errorf("memorystore: %w", err)
			}
		}
	}

	type place struct {
		h, kind uint64
		sh      *shard
	}
	var (
		pl   [16]place // at most 16 limits (tollgate.CheckAll)
		lock [16]*shard
		ds   [16]decision
	)
	locks := lock[:0]
	for i := range ps {
		kind := kindOf(&ps[i])
		h, sh := s.locate(key, kind)
		pl[i] = place{h, kind, sh}
		// Insert sh into locks, kept in the shards' order, once.
		j := 0
		for j < len(locks) && locks[j].index < sh.index {
			j++
		}
		if j < len(locks) && locks[j] == sh {
			continue
		}
		locks = append(locks, nil)
		copy(locks[j+1:], locks[j:])
		locks[j] = sh
	}
	for _, sh := range locks {
		sh.mu.Lock()
	}
	all := true
	for i := range ps {
		p := &pl[i]
		s.try(&ds[i], p.sh, p.h, p.kind, key, &ps[i], now, int64(n))
		all = all && ds[i].allowed
	}
	for i := range ps {
		p, cost := &pl[i], int64(n)
		if !all && ds[i].allowed {
			cost = 0 // it would admit, but another limit denies: a look
		}
		ds[i] = decision{}
		s.decide(&ds[i], p.sh, p.h, p.kind, key, &ps[i], now, cost)
	}
	for _, sh := range locks {
		sh.mu.Unlock()
	}
	if s.blocks.moving.Load() {
		s.move()
	}
	for i := range ps {
		dst = append(dst, ds[i].result(limits[i]))
	}
	return dst, nil
}

// try makes into d the decision decide would make on key's entry in sh
// (locked), on a copy of its state, changing nothing. A sliding window
// log is copied whole (at most tollgate.MaxLogRate entries): an admission
// drops the entries that left the window before it adds its own, which on
// a copy sharing the log's buffer would overwrite entries the log still
// holds.
func (s *Store) try(d *decision, sh *shard, h, kind uint64, key string, p *tollgate.Params, now, n int64) {
	var (
		st    state
		log   ring
		fresh = true
	)
	if i := sh.find(h, kind, key); i >= 0 && sh.tab[i].expires > now {
		e := &sh.tab[i]
		st, fresh = e.state, false
		if p.Algorithm == tollgate.SlidingWindowLog && e.a != 0 {
			log = sh.logs[e.a-1]
			log.buf = slices.Clone(log.buf)
		}
	}
	decideOn(d, &st, &log, fresh, p, now, n)
}
