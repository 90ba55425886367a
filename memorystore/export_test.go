package memorystore

import (
	"time"

	"github.com/tollgate/tollgate"
)

// TTL reports how long key's state is kept, measured on the store's clock.
func (s *Store) TTL(key string, limit tollgate.Limit) (time.Duration, bool) {
	exp, ok := s.expiry(key, limit)
	if !ok {
		return 0, false
	}
	return exp.Sub(time.UnixMicro(s.clock())), true
}

// Until returns how long from the store's clock until t.
func (s *Store) Until(t time.Time) time.Duration {
	return t.Sub(time.UnixMicro(s.clock()))
}

// Held reports the permits key holds, lapsed ones not yet dropped included:
// how many, and when the last one lapses. It is what Redis's ZCARD and the
// key's TTL show for redisstore.
func (s *Store) Held(key string) (int, time.Time) { return s.permits.held(key) }

// Sweep reclaims every expired state at the store's clock, with the
// reclaim an insertion runs on a few entries at a time: each slot of every
// table in turn, until no expired entry is left.
func (s *Store) Sweep() {
	now := s.clock()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for expired := true; expired; {
			for h := range len(sh.tab) {
				if sh.n > 0 {
					s.reclaim(sh, uint64(h), now)
				}
			}
			expired = false
			for j := range sh.tab {
				if e := &sh.tab[j]; e.kind != 0 && e.expires <= now {
					expired = true
				}
			}
		}
		sh.mu.Unlock()
	}
}
