package memorystore

import (
	"testing"
	"unsafe"
)

// TestTableSizes: table hands out tables of the size asked for, each its
// own memory: below a block's worth, separate allocations; from then on,
// consecutive pieces of one block, and a table of its own for a shard that
// asks for less than the current block's size.
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
		{"first of a block", 0, block, true},
		{"last of it", 3, block, true},
		{"behind the block", 1, block / 2, false},
		{"next block", 2, 2 * block, true},
		{"behind it, at the old block's size", 0, block, false},
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
