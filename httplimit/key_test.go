package httplimit_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/httplimit"
	"github.com/tollgate/tollgate/memorystore"
)

// keyRecorder is a memory store that remembers the last key it was asked
// about, so a test can see the store keys the middleware builds.
type keyRecorder struct {
	tollgate.Store
	mu   sync.Mutex
	last string
}

func (k *keyRecorder) AllowN(ctx context.Context, key string, l tollgate.Limit, n int) (tollgate.Result, error) {
	k.mu.Lock()
	k.last = key
	k.mu.Unlock()
	return k.Store.AllowN(ctx, key, l, n)
}

func headerFunc(name string) func(*http.Request) (string, bool) {
	return func(r *http.Request) (string, bool) {
		vs, ok := r.Header[name]
		if !ok {
			return "", false
		}
		return vs[0], true
	}
}

// An attacker who controls the parts of a composite key must not be able
// to spell a victim's tuple: with a 999-byte first part, a length clamped
// at 999 made ("P008:abc", "x") and ("P", "abc001:x") one counter.
func TestCompositeKeyCollision(t *testing.T) {
	t.Parallel()
	lim := mustNew(t, memorystore.New(), []httplimit.Rule{{
		Name:     "tenant-user",
		Key:      httplimit.Composite(httplimit.Func("tenant", headerFunc("X-Tenant")), httplimit.Func("user", headerFunc("X-User"))),
		Policies: []httplimit.Policy{{Name: "hourly", Limit: tollgate.PerHour(1)}},
	}})
	h := lim.Handler(okHandler)
	p := strings.Repeat("p", 999)
	attacker := http.Header{"X-Tenant": {p + "008:abc"}, "X-User": {"x"}}
	victim := http.Header{"X-Tenant": {p}, "X-User": {"abc001:x"}}
	for _, tc := range []struct {
		who    string
		header http.Header
		want   int
	}{
		{"attacker", attacker, 200},
		{"attacker again", attacker, 429},
		{"victim", victim, 200},
	} {
		if got := do(h, "GET", "/", "192.0.2.1:1", tc.header).Code; got != tc.want {
			t.Errorf("%s: status %d, want %d", tc.who, got, tc.want)
		}
	}
}

// TestCompositeKeyProperty sends random tuples — parts rich in digits and
// ':', around the lengths where a clamped length broke — through the
// middleware: distinct tuples never reach the same store key.
func TestCompositeKeyProperty(t *testing.T) {
	t.Parallel()
	store := &keyRecorder{Store: memorystore.New()}
	lim := mustNew(t, store, []httplimit.Rule{{
		Name:     "pair",
		Key:      httplimit.Composite(httplimit.Func("a", headerFunc("X-A")), httplimit.Func("b", headerFunc("X-B"))),
		Policies: []httplimit.Policy{{Name: "p", Limit: tollgate.PerHour(1000)}},
	}})
	h := lim.Handler(okHandler)
	rng := rand.New(rand.NewPCG(3, 4))
	lengths := []int{0, 1, 3, 8, 99, 500, 998, 999, 1000, 1006}
	part := func() string {
		b := make([]byte, lengths[rng.IntN(len(lengths))]+rng.IntN(2))
		for i := range b {
			b[i] = "0189:ab"[rng.IntN(7)]
		}
		return string(b)
	}
	seen := map[string][2]string{}
	for range 2000 {
		tuple := [2]string{part(), part()}
		if rng.IntN(4) == 0 {
			// The shape of the known collision: shift bytes between parts.
			cut := rng.IntN(len(tuple[0]) + 1)
			tuple = [2]string{tuple[0][:cut], tuple[0][cut:] + tuple[1]}
		}
		do(h, "GET", "/", "192.0.2.1:1", http.Header{"X-A": {tuple[0]}, "X-B": {tuple[1]}})
		store.mu.Lock()
		key := store.last
		store.mu.Unlock()
		if prev, ok := seen[key]; ok && prev != tuple {
			t.Fatalf("(%.12q…, %.12q…) and (%.12q…, %.12q…) share the key %.40q…", prev[0], prev[1], tuple[0], tuple[1], key)
		}
		seen[key] = tuple
	}
}

// A value too long for a store is hashed; a client sending that hash (in
// any spelling) as its own value must not spend the long value's counter.
func TestHashedKeysApartFromLiterals(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", 4000)
	sum := sha256.Sum256([]byte(long))
	h := hex.EncodeToString(sum[:])
	for _, forged := range []string{"sha256=" + h, h, "#" + h} {
		t.Run(forged[:8], func(t *testing.T) {
			t.Parallel()
			lim := mustNew(t, memorystore.New(), []httplimit.Rule{{
				Name:     "api",
				Key:      httplimit.Header("X-API-Key"),
				Policies: []httplimit.Policy{{Name: "hourly", Limit: tollgate.PerHour(1)}},
			}})
			handler := lim.Handler(okHandler)
			for _, tc := range []struct {
				who, key string
				want     int
			}{
				{"attacker", forged, 200},
				{"victim", long, 200},
				{"victim again", long, 429},
			} {
				if got := do(handler, "GET", "/", "192.0.2.1:1", http.Header{"X-Api-Key": {tc.key}}).Code; got != tc.want {
					t.Errorf("%s: status %d, want %d", tc.who, got, tc.want)
				}
			}
		})
	}
}
