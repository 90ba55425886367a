package memorystore

import (
	"encoding/binary"
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/tollgate/tollgate"
)

// A key's state is kept, as in Redis, per (key, algorithm, period), so that
// several limits on one key do not share a counter. Each shard holds its
// keys in a table of its own rather than a Go map: a decision then hashes
// the key once (the hash picks the shard with its top bits and the slot
// with its low bits), and finds the key's state in the slot itself, one
// 64-byte entry, where a map of pointers to states reads a control word, a
// slot and the state: on a store of many keys each of those is a miss of
// the CPU's caches, and those misses were most of a decision's time.
//
// The table is open-addressed with linear probing, at most half full, so a
// key is found in its first slot or the next almost always. A removal
// shifts the entries after it back, so there are no tombstones and a look-up
// stops at the first empty slot.

// entry is one key's state: its slot in the table. kind 0 marks an empty
// slot: a key's kind is never 0, its period being at least 1 µs. (A mark
// in the hash would need a hash of 0 moved to another, an instruction too
// many for locate to be inlined.)
//
// A key of at most inlineKey bytes is kept in the entry itself, so that
// the entry's one line of memory holds all a look-up compares: a key kept
// apart would be a second miss of the CPU's caches, which could only start
// once the entry had arrived. A longer key is kept in its shard's keys,
// and the entry holds where its bytes are there. So the table holds no
// pointers, and the garbage collector never scans it.
type entry struct {
	tag  uint64 // the key's hash and length: see tagOf
	kind uint64 // the period in µs << 3 | the algorithm
	// k0 and k1 are the key's bytes (see keyWords), or for a key longer
	// than inlineKey, its offset in the shard's long and its length.
	k0, k1 uint64
	state
}

// inlineKey is the longest key kept in its entry.
const inlineKey = 16

// tagOf returns the tag of a key of hash h: the hash's low 56 bits (a
// shard's keys share its top bits, which pick the shard) and the key's
// length, 255 for any longer. The home slot of a tag is its hash's, as no
// table has 2^56 slots.
func tagOf(h uint64, key string) uint64 {
	return h&(1<<56-1) | uint64(min(len(key), 255))<<56
}

// keyWords returns the bytes of a key of 1 to inlineKey bytes as two
// words: with its length, which its tag holds, they are the key's and no
// other's. (From 8 bytes on, the first eight and the last eight, which
// overlap below 16; from 4, the first four and the last four; below 4,
// the first, middle and last byte.)
func keyWords(key string) (w0, w1 uint64) {
	b := unsafe.Slice(unsafe.StringData(key), len(key))
	switch n := len(b); {
	case n >= 8:
		return binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[n-8:])
	case n >= 4:
		return uint64(binary.LittleEndian.Uint32(b)) | uint64(binary.LittleEndian.Uint32(b[n-4:]))<<32, 0
	default:
		return uint64(b[0]) | uint64(b[n/2])<<8 | uint64(b[n-1])<<16, 0
	}
}

// hashKey returns the hash of key. A key kept in its entry is hashed from
// its words, which the look-up compares too, by two multiplications
// keyed by the store's random seeds, as the runtime hashes where the CPU
// has no AES instructions; a longer one by maphash.
func (s *Store) hashKey(key string) uint64 {
	if len(key) > inlineKey {
		return maphash.String(s.seed, key)
	}
	w0, w1 := keyWords(key)
	return mix(mix(w0^s.seeds[0], w1^s.seeds[1])^s.seeds[2], uint64(len(key))^s.seeds[3])
}

// mix returns the 128-bit product of a and b folded into 64 bits.
func mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// kindOf packs an algorithm and a period (at most 2^46 µs, as Params
// guarantees) into one word, compared at once. A calendar window's kind has
// its top bit set and its (unit, zone)'s number in place of the period, so
// it never meets an epoch window's or another calendar's.
func kindOf(p *tollgate.Params) uint64 {
	if p.Calendar != nil {
		return 1<<63 | p.Calendar.ID<<3 | uint64(p.Algorithm)
	}
	return uint64(p.PeriodUS)<<3 | uint64(p.Algorithm)
}

type shard struct {
	mu  sync.Mutex
	tab []entry // a power of two long, or nil before the first key
	n   int     // occupied entries
	// logs holds the sliding window logs of this shard's keys (their
	// entry's a is the index + 1), freeLogs the indexes of logs whose key
	// is gone: a new key reuses one, with its buffer if it kept one.
	logs     []ring
	freeLogs []int
	// long holds the bytes of the keys longer than inlineKey, end to end,
	// each where its entry's k0 says: a look-up compares them in place,
	// one read of memory beyond the entry, as a key's own string would
	// be. garbage counts the bytes of keys that are gone, which place
	// reclaims by compacting long once they are half of it.
	long      []byte
	garbage   int
	evictions atomic.Uint64
	index     int // the shard's place in the store's shards
	// where is tab's address with log2(len(tab)) in its top 6 bits (Go's
	// heap addresses have 48 bits), read without the lock to prefetch a
	// key's entry: a stale or wrong value costs a useless prefetch,
	// nothing more.
	where atomic.Uint64
	_     [112]byte // 256 bytes, two lines of 128: neighbouring shards' locks on lines of their own
}

// maxFreeBuffers bounds how many sliding window logs whose key is gone keep
// their buffer in each shard.
const maxFreeBuffers = 16

// find returns the index of key's entry of the given hash and kind in sh
// (locked), or -1. A key kept in its entry is compared by its words, in
// a loop that calls nothing; a longer one by findLong.
func (sh *shard) find(h, kind uint64, key string) int {
	if len(sh.tab) == 0 {
		return -1
	}
	if len(key) > inlineKey {
		return sh.findLong(h, kind, key)
	}
	tag := tagOf(h, key)
	w0, w1 := keyWords(key)
	mask := uint64(len(sh.tab) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		e := &sh.tab[i]
		if e.tag == tag && e.kind == kind && e.k0 == w0 && e.k1 == w1 {
			return int(i)
		}
		if e.kind == 0 {
			return -1
		}
	}
}

// findLong is find for a key longer than inlineKey, compared in sh's long
// only in the entries of its tag.
func (sh *shard) findLong(h, kind uint64, key string) int {
	tag := tagOf(h, key)
	mask := uint64(len(sh.tab) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		e := &sh.tab[i]
		if e.tag == tag && e.kind == kind && string(sh.long[e.k0:e.k0+e.k1]) == key {
			return int(i)
		}
		if e.kind == 0 {
			return -1
		}
	}
}

// findEntry returns the index of the entry of sh (locked) that holds the
// same key and kind as e, a copy of it taken earlier, or -1.
func (sh *shard) findEntry(e *entry) int {
	mask := uint64(len(sh.tab) - 1)
	for i := e.tag & mask; ; i = (i + 1) & mask {
		f := &sh.tab[i]
		if f.tag == e.tag && f.kind == e.kind && f.k0 == e.k0 && f.k1 == e.k1 {
			return int(i)
		}
		if f.kind == 0 {
			return -1
		}
	}
}

// place puts a new entry in sh (locked, with room for it: at most half
// full after it) and returns its index. It keeps a copy of key: the
// doors lend the store keys whose bytes they reuse (internal/store/lentkeys).
func (sh *shard) place(h, kind uint64, key string) int {
	mask := uint64(len(sh.tab) - 1)
	i := h & mask
	for sh.tab[i].kind != 0 {
		i = (i + 1) & mask
	}
	e := entry{tag: tagOf(h, key), kind: kind}
	if len(key) > inlineKey {
		if sh.garbage >= minGarbage && 2*sh.garbage >= len(sh.long) {
			sh.compact()
		}
		e.k0, e.k1 = uint64(len(sh.long)), uint64(len(key))
		sh.long = append(sh.long, key...)
	} else {
		e.k0, e.k1 = keyWords(key)
	}
	sh.tab[i] = e
	sh.n++
	return int(i)
}

// minGarbage is the fewest bytes of gone keys that a shard compacts its
// long for: below it, compacting would cost more than the bytes are worth.
const minGarbage = 4 << 10

// compact moves the bytes of sh's (locked) long keys that are still there
// into a new long, in the order of their entries, and points the entries
// at them: the bytes of the keys that are gone are left behind. Its cost,
// one pass over the table, is paid once for at least half of long gone.
func (sh *shard) compact() {
	long := make([]byte, 0, len(sh.long)-sh.garbage)
	for i := range sh.tab {
		if e := &sh.tab[i]; e.kind != 0 && e.tag>>56 > inlineKey {
			off := uint64(len(long))
			long = append(long, sh.long[e.k0:e.k0+e.k1]...)
			e.k0 = off
		}
	}
	sh.long, sh.garbage = long, 0
}

// grow doubles sh's table (or makes its first one).
func (s *Store) grow(sh *shard) {
	sh.moveTo(s.table(sh.index, max(8, 2*len(sh.tab))))
}

// moveTo moves sh's (locked) entries into tab, empty and at least as
// large as its table, which it then is.
func (sh *shard) moveTo(tab []entry) {
	old := sh.tab
	sh.tab = tab
	sh.where.Store(uint64(uintptr(unsafe.Pointer(&tab[0]))) | uint64(bits.TrailingZeros(uint(len(tab))))<<whereShift)
	mask := uint64(len(tab) - 1)
	for k := range old {
		if e := &old[k]; e.kind != 0 {
			i := e.tag & mask
			for tab[i].kind != 0 {
				i = (i + 1) & mask
			}
			tab[i] = *e
		}
	}
}

// remove empties slot i of sh (locked), keeping its key's log buffer for
// reuse, and moves back the entries after it that can move, so that every
// key stays reachable from its home slot without gaps.
func (sh *shard) remove(i int) {
	if e := &sh.tab[i]; e.kind&7 == uint64(tollgate.SlidingWindowLog) && e.a > 0 {
		if len(sh.freeLogs) >= maxFreeBuffers {
			// Keep a few buffers for keys to come, not every one a
			// crowd of keys once had.
			sh.logs[e.a-1] = ring{}
		}
		sh.freeLogs = append(sh.freeLogs, int(e.a-1))
	}
	if e := &sh.tab[i]; e.tag>>56 > inlineKey {
		sh.garbage += int(e.k1)
	}
	sh.n--
	mask := len(sh.tab) - 1
	for {
		j := i
		for {
			j = (j + 1) & mask
			if sh.tab[j].kind == 0 {
				sh.tab[i] = entry{}
				return
			}
			// The entry at j may move to i unless its home slot lies
			// cyclically in (i, j].
			home := int(sh.tab[j].tag) & mask
			if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
				break
			}
		}
		sh.tab[i] = sh.tab[j]
		i = j
	}
}

// log returns the sliding window log of entry e of sh (locked), giving it
// one if it has none.
func (sh *shard) log(e *entry) *ring {
	if e.a == 0 {
		if n := len(sh.freeLogs); n > 0 {
			e.a = int64(sh.freeLogs[n-1]) + 1
			sh.freeLogs = sh.freeLogs[:n-1]
			r := &sh.logs[e.a-1]
			r.head, r.n = 0, 0
			return r
		}
		sh.logs = append(sh.logs, ring{})
		e.a = int64(len(sh.logs))
	}
	return &sh.logs[e.a-1]
}

// minBlock is the least size, in entries, of a block of tables: 8 MiB,
// four huge pages on x86-64 and arm64. minBlockTable is the least size of
// a table cut from a block: a shard's first keys, before it holds 65, are
// not worth a block (with many shards, many megabytes) for the whole
// store.
const (
	minBlock      = 8 << 20 / int(unsafe.Sizeof(entry{}))
	minBlockTable = 256
)

// table returns an empty table of size entries for shard i.
//
// A store of many keys spends most of a decision waiting for the key's
// entry, a miss of the CPU's caches and, with 4 KiB pages, of its TLB as
// well: the tables of 100,000 keys span 4,000 pages, more than the TLB
// holds, and in a virtual machine a TLB miss walks two page tables. So once
// the shards' tables of a size take minBlock in all (and are at least
// minBlockTable entries each), they are cut from one block, which the
// system is asked to back with huge pages (Linux: transparent huge pages,
// "madvise" or "always"), 2 MiB each: a handful cover the block.
//
// The block is made when half the shards have asked for a table of its
// size (the first half get tables of their own meanwhile), and then every
// shard moves into it (see move), the other half a little early: so the
// store never holds a block beside the smaller tables of shards that may
// not grow for a long time, and its tables take about 256 bytes a key
// then, as the tables of shards just grown would. A shard that falls
// behind afterwards gets tables of its own until it catches up.
func (s *Store) table(i, size int) []entry {
	if size < minBlockTable || size*len(s.shards) < minBlock {
		return make([]entry, size)
	}
	b := &s.blocks
	b.mu.Lock()
	defer b.mu.Unlock()
	if size == b.size {
		return b.block[i*size : (i+1)*size : (i+1)*size]
	}
	if size < b.size {
		return make([]entry, size)
	}
	if b.asked == nil {
		b.asked = map[int]int{}
	}
	if b.asked[size]++; 2*b.asked[size] < len(s.shards) {
		return make([]entry, size)
	}
	clear(b.asked)
	b.block = make([]entry, size*len(s.shards))
	b.size = size
	adviseHugePages(b.block)
	b.moving.Store(true)
	return b.block[i*size : (i+1)*size : (i+1)*size]
}

// move moves every shard whose table is not in the current block into
// it. The call that made the block runs it once its own shard is
// unlocked, locking one shard at a time: no lock is held while it waits
// for another.
func (s *Store) move() {
	b := &s.blocks
	if !b.moving.CompareAndSwap(true, false) {
		return
	}
	b.mu.Lock()
	block, size := b.block, b.size
	b.mu.Unlock()
	for i := range s.shards {
		sh := &s.shards[i]
		dst := block[i*size : (i+1)*size : (i+1)*size]
		sh.mu.Lock()
		if len(sh.tab) <= size && (len(sh.tab) == 0 || &sh.tab[0] != &dst[0]) {
			sh.moveTo(dst)
		}
		sh.mu.Unlock()
	}
}

// prefetch starts bringing the entry at hash h's home slot into the CPU's
// caches, without the lock: the entry is read under the lock, and by then
// it is on its way. A table of fewer than 2^minPrefetch entries (8 KiB) is
// left alone: a store of such tables mostly stays in the caches, and the
// call would cost a cached decision a tenth of its time.
func (sh *shard) prefetch(h uint64) {
	if w := sh.where.Load(); w>>whereShift >= minPrefetch {
		mask := uint64(1)<<(w>>whereShift) - 1
		prefetch(uintptr(w&(1<<whereShift-1) + h&mask*uint64(unsafe.Sizeof(entry{}))))
	}
}

// whereShift places a table's log2 size in a shard's where; minPrefetch
// is the least log2 size of a table whose entries are prefetched.
const (
	whereShift  = 58
	minPrefetch = 7
)

// locate returns the hash of (key, kind) and the shard that holds it.
func (s *Store) locate(key string, kind uint64) (uint64, *shard) {
	h := s.hashKey(key) ^ kind*0x9e3779b97f4a7c15
	return h, &s.shards[h>>s.shift]
}
