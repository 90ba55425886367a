package tiered

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/tollgate/tollgate"
)

// skey identifies a key's state as the stores do: one per (key, algorithm,
// period, calendar).
type skey struct {
	key    string
	alg    tollgate.Algorithm
	period time.Duration
	cal    tollgate.Calendar
}

func keyOf(key string, limit tollgate.Limit) skey {
	return skey{key: key, alg: limit.Algorithm, period: limit.Period, cal: limit.Calendar}
}

// table is a bounded map from skey to V, in independently locked shards. A
// nil table holds nothing, and keeps nothing it is given.
// When a shard is full, an insertion drops a few expired entries or, if
// none, one arbitrary entry: the tables hold hints (what the global store
// said, tokens leased), and losing one only costs a global call.
type table[V any] struct {
	shards   []tshard[V]
	mask     uint64
	seed     maphash.Seed
	perShard int
	expired  func(*V, time.Time) bool
}

type tshard[V any] struct {
	mu sync.Mutex
	m  map[skey]V
	_  [40]byte // keep neighbouring shards' locks off one cache line
}

const tableShards = 64

func newTable[V any](maxKeys int, expired func(*V, time.Time) bool) *table[V] {
	t := &table[V]{
		shards:   make([]tshard[V], tableShards),
		mask:     tableShards - 1,
		seed:     maphash.MakeSeed(),
		perShard: max(1, maxKeys/tableShards),
		expired:  expired,
	}
	for i := range t.shards {
		t.shards[i].m = make(map[skey]V)
	}
	return t
}

func (t *table[V]) shard(k skey) *tshard[V] {
	return &t.shards[maphash.String(t.seed, k.key)&t.mask]
}

// update calls f with the entry for k (and whether there is one) under the
// shard's lock; f returns the new entry and whether to keep it.
func (t *table[V]) update(k skey, now time.Time, f func(v V, ok bool) (V, bool)) {
	if t == nil {
		return
	}
	sh := t.shard(k)
	sh.mu.Lock()
	old, ok := sh.m[k]
	v, keep := f(old, ok)
	switch {
	case keep && !ok:
		if len(sh.m) >= t.perShard {
			t.makeRoom(sh, now)
		}
		sh.m[k] = v
	case keep:
		sh.m[k] = v
	case ok:
		delete(sh.m, k)
	}
	sh.mu.Unlock()
}

// makeRoom drops expired entries among a few, or the first one seen.
func (t *table[V]) makeRoom(sh *tshard[V], now time.Time) {
	var victim skey
	i := 0
	for k, v := range sh.m { // map iteration starts at a random place
		if t.expired(&v, now) {
			delete(sh.m, k)
			return
		}
		if i == 0 {
			victim = k
		}
		if i++; i == 8 {
			break
		}
	}
	delete(sh.m, victim)
}

func (t *table[V]) delete(k skey) {
	if t == nil {
		return
	}
	sh := t.shard(k)
	sh.mu.Lock()
	delete(sh.m, k)
	sh.mu.Unlock()
}

func (t *table[V]) len() int {
	if t == nil {
		return 0
	}
	n := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}
