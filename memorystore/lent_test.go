package memorystore_test

import (
	"context"
	"testing"
	"unsafe"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/store/lentkeys"
	"github.com/tollgate/tollgate/memorystore"
)

// TestLentKeys: the store may be lent its keys — their bytes valid only
// during the call — because it copies a key it keeps: a key's bytes
// written over after the call that made its state change neither that
// state nor the key it is found by. A type wrapping the store is not lent
// keys.
func TestLentKeys(t *testing.T) {
	t.Parallel()
	s := memorystore.New()
	if !lentkeys.Lend(s) {
		t.Fatal("memorystore is not lent its keys")
	}
	if lentkeys.Lend(struct{ tollgate.Store }{s}) {
		t.Error("a store wrapping memorystore is lent its keys")
	}
	ctx := context.Background()
	limit := tollgate.PerHour(10)
	buf := []byte("lent:aaaa")
	lent := unsafe.String(unsafe.SliceData(buf), len(buf))
	for i := range 3 {
		if _, err := s.AllowN(ctx, lent, limit, 1); err != nil {
			t.Fatalf("AllowN %d: %v", i, err)
		}
	}
	copy(buf[5:], "bbbb") // the caller reuses its buffer: lent now reads "lent:bbbb"
	for _, tc := range []struct {
		key  string
		want int
	}{{"lent:aaaa", 6}, {"lent:bbbb", 9}} {
		res, err := s.AllowN(ctx, tc.key, limit, 1)
		if err != nil {
			t.Fatal(err)
		}
		if res.Remaining != tc.want {
			t.Errorf("%s: %d remaining, want %d", tc.key, res.Remaining, tc.want)
		}
	}
}
