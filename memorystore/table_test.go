package memorystore

import (
	"context"
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/tollgate/tollgate"
)

// TestTableSizes: table hands out tables of the size asked for, each its
// own memory: below a block's worth, separate allocations; from then on,
// a table of the shard's own until half the shards have asked for that
// size, then the shard's piece of a block, as for every shard that asks
// for that size afterwards; a table of its own for a shard that asks for
// less than the current block's size.
func TestTableSizes(t *testing.T) {
	t.Parallel()
	s := New(WithShards(4))
	const shards = 4
	block := minBlock / shards
	tests := []struct {
		name      string
		shard     int
		size      int
		fromBlock bool
	}{
		{"small", 1, 8, false},
		{"below a block", 2, block / 2, false},
		{"first to ask", 0, block, false},
		{"second to ask: half the shards", 3, block, true},
		{"behind the block", 1, block / 2, false},
		{"third to ask", 2, block, true},
		{"first to ask for the next", 0, 2 * block, false},
		{"second to ask for the next", 1, 2 * block, true},
		{"behind it, at the old block's size", 3, block, false},
	}
	for _, tc := range tests {
		tab := s.table(tc.shard, tc.size)
		if got, want := len(tab), tc.size; got != want {
			t.Fatalf("%s: len = %d, want %d", tc.name, got, want)
		}
		if got, want := cap(tab), tc.size; got != want {
			t.Fatalf("%s: cap = %d, want %d", tc.name, got, want)
		}
		for i := range tab {
			if tab[i] != (entry{}) {
				t.Fatalf("%s: entry %d is not empty", tc.name, i)
			}
		}
		b := s.blocks.block
		in := false
		if len(b) > 0 {
			start, at := uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&tab[0]))
			in = at >= start && at < start+uintptr(len(b))*unsafe.Sizeof(entry{})
		}
		if got, want := in, tc.fromBlock; got != want {
			t.Fatalf("%s: from the block = %v, want %v", tc.name, got, want)
		}
		if tc.fromBlock {
			if got, want := &tab[0], &b[tc.shard*tc.size]; got != want {
				t.Fatalf("%s: table at %p, want the shard's place in the block, %p", tc.name, got, want)
			}
		}
		tab[0].kind = 1 // taken, as a key would
	}
}

// TestEveryShardMovesIntoTheBlock: once a block is made, every shard's
// table is its piece of the block, the shards that had not grown yet
// included, and the tables take no more than about 256 bytes a key (the
// half of the shards not grown yet are a little below a quarter full): a
// store whose keys stay near the point where its shards grow does not
// keep a block beside their smaller tables.
func TestEveryShardMovesIntoTheBlock(t *testing.T) {
	t.Parallel()
	const shards = 16 // blocks from 8,192 entries a shard, past 2,048 keys
	s := New(WithShards(shards))
	ctx := context.Background()
	limit := tollgate.Limit{Rate: 100, Period: time.Hour, Burst: 10}
	blocks := 0
	for k := 0; blocks < 2; k++ {
		size := s.blocks.size
		if _, err := s.AllowN(ctx, fmt.Sprint("k", k), limit, 1); err != nil {
			t.Fatal(err)
		}
		if s.blocks.size == size {
			continue
		}
		blocks++
		size = s.blocks.size
		tables := 0
		for i := range s.shards {
			sh := &s.shards[i]
			if got, want := &sh.tab[0], &s.blocks.block[i*size]; got != want {
				t.Fatalf("block of %d entries a shard, at key %d: shard %d's table is at %p, want %p", size, k, i, got, want)
			}
			tables += len(sh.tab) * int(unsafe.Sizeof(entry{}))
		}
		if perKey := tables / (k + 1); perKey > 300 {
			t.Errorf("block of %d entries a shard, at key %d: tables take %d bytes a key, want at most 300", size, k, perKey)
		}
	}
}

// TestPrefetchNeverFaults: a prefetch is a hint, whatever the address, so
// a shard's stale or torn table address can cost nothing but time.
func TestPrefetchNeverFaults(t *testing.T) {
	t.Parallel()
	for _, addr := range []uintptr{0, 1, 4096, ^uintptr(0) >> 1, ^uintptr(0) - 63} {
		prefetch(addr)
	}
	var sh shard
	sh.prefetch(12345) // no table yet
	sh.where.Store(^uint64(0))
	sh.prefetch(^uint64(0))
}

// TestWhereLocatesTheTable: a shard's where names its table's first entry
// and its size, through growth from tables of its own into blocks.
func TestWhereLocatesTheTable(t *testing.T) {
	t.Parallel()
	s := New(WithShards(1))
	sh := &s.shards[0]
	for range 18 { // from 8 entries to 2^20, blocks from 2^17 on
		s.grow(sh)
		w := sh.where.Load()
		if got, want := w&(1<<whereShift-1), uint64(uintptr(unsafe.Pointer(&sh.tab[0]))); got != want {
			t.Fatalf("%d entries: where's address = %#x, want %#x", len(sh.tab), got, want)
		}
		if got, want := 1<<(w>>whereShift), len(sh.tab); got != want {
			t.Fatalf("where's size = %d, want %d", got, want)
		}
	}
}

// TestNoBlockForAFewKeys: a store of many shards does not make a block of
// many megabytes for its first keys: a table below minBlockTable entries
// is the shard's own, whatever the tables of all shards would take.
func TestNoBlockForAFewKeys(t *testing.T) {
	t.Parallel()
	s := New(WithShards(1 << 15))
	for _, size := range []int{8, 16, minBlockTable / 2} {
		if size*len(s.shards) < minBlock {
			t.Fatalf("%d entries for %d shards take less than a block: the case is not tested", size, len(s.shards))
		}
		if got, want := len(s.table(0, size)), size; got != want {
			t.Fatalf("len = %d, want %d", got, want)
		}
		if got, want := len(s.blocks.block), 0; got != want {
			t.Fatalf("%d entries: a block of %d entries was made, want none", size, got)
		}
	}
}

// TestKeyWords: the words of a key of 1 to inlineKey bytes change with
// any byte of it, so keys of one length have the same words only if they
// are the same key.
func TestKeyWords(t *testing.T) {
	t.Parallel()
	for n := 1; n <= inlineKey; n++ {
		key := []byte("0123456789abcdef"[:n])
		w0, w1 := keyWords(string(key))
		for i := range n {
			for _, c := range []byte{0, key[i] ^ 1, 0xff} {
				other := append([]byte(nil), key...)
				other[i] = c
				if o0, o1 := keyWords(string(other)); o0 == w0 && o1 == w1 {
					t.Errorf("%q and %q have the same words", key, other)
				}
			}
		}
	}
}

// TestLongKeysEvicted: keys longer than inlineKey, kept apart from their
// entries, are freed with them when the store is full and evicts, and
// their room is reclaimed: each live entry's key is its own, and the bytes
// kept are never much more than twice the live keys'.
func TestLongKeysEvicted(t *testing.T) {
	t.Parallel()
	s := New(WithMaxKeys(64), WithShards(1))
	ctx := context.Background()
	limit := tollgate.PerMinute(10)
	for i := range 2000 {
		key := fmt.Sprintf("a key longer than sixteen bytes: %d", i)
		if i%3 == 0 {
			key = fmt.Sprint("k", i) // kept in its entry
		}
		r, err := s.AllowN(ctx, key, limit, 1)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := r.Remaining, 9; got != want {
			t.Fatalf("%q: Remaining = %d, want %d", key, got, want)
		}
		sh := &s.shards[0]
		seen, live := map[uint64]bool{}, 0
		for j := range sh.tab {
			e := &sh.tab[j]
			if e.kind == 0 || e.tag>>56 <= inlineKey {
				continue
			}
			if seen[e.k0] {
				t.Fatalf("after %q: two entries hold the key at %d", key, e.k0)
			}
			seen[e.k0], live = true, live+int(e.k1)
			k := string(sh.long[e.k0 : e.k0+e.k1])
			if h, _ := s.locate(k, e.kind); tagOf(h, k) != e.tag {
				t.Fatalf("after %q: an entry holds %q, not its key", key, k)
			}
		}
		if got, want := len(sh.long), live+sh.garbage; got != want {
			t.Fatalf("after %q: %d bytes of long keys kept, want %d live + %d gone", key, got, live, sh.garbage)
		}
		// Compacted once half is gone: never much more than twice what
		// is live.
		if got, most := len(sh.long), 2*live+minGarbage+64; got > most {
			t.Fatalf("after %q: %d bytes of long keys kept for %d live, want at most %d", key, got, live, most)
		}
	}
	if s.Stats().Evictions == 0 {
		t.Fatal("no key was evicted")
	}
}

// TestShortKeysSpread: keys kept in their entries, hashed from their
// words, spread evenly over the shards by their hashes' top bits and over
// a table's slots by their low bits, keys that differ in one digit too.
func TestShortKeysSpread(t *testing.T) {
	t.Parallel()
	s := New(WithShards(256))
	const nkeys = 1 << 16
	var shards, slots [256]int
	for i := range nkeys {
		h, sh := s.locate(fmt.Sprint("user:", i), 1<<3)
		shards[sh.index]++
		slots[h&255]++
	}
	for i := range 256 {
		if n, avg := shards[i], nkeys/256; n < avg/2 || n > 2*avg {
			t.Errorf("shard %d holds %d keys, want about %d", i, n, avg)
		}
		if n, avg := slots[i], nkeys/256; n < avg/2 || n > 2*avg {
			t.Errorf("slot %d holds %d keys, want about %d", i, n, avg)
		}
	}
}

// TestShardSize: a shard fills whole 128-byte lines (the unit the CPU's
// adjacent-line prefetcher fetches), so no two shards' locks share one.
func TestShardSize(t *testing.T) {
	if got := unsafe.Sizeof(shard{}); got%128 != 0 {
		t.Fatalf("a shard is %d bytes, want a multiple of 128", got)
	}
}
