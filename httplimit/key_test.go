package httplimit_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
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
		Policies: []enforce.Policy{{Name: "hourly", Limit: tollgate.PerHour(1)}},
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

// TestCompositeKeyProperty sends every tuple of two parts built from a few
// tokens — a 999-byte run, length-like prefixes, plain text — through the
// middleware, so that every way of re-splitting one tuple's bytes into
// another is tried: distinct tuples never reach the same store key.
func TestCompositeKeyProperty(t *testing.T) {
	t.Parallel()
	store := &keyRecorder{Store: memorystore.New()}
	lim := mustNew(t, store, []httplimit.Rule{{
		Name:     "pair",
		Key:      httplimit.Composite(httplimit.Func("a", headerFunc("X-A")), httplimit.Func("b", headerFunc("X-B"))),
		Policies: []enforce.Policy{{Name: "p", Limit: tollgate.PerHour(1000)}},
	}})
	h := lim.Handler(okHandler)
	tokens := []string{strings.Repeat("p", 999), "008:", "abc", "001:", "x"}
	parts := []string{""}
	for range 3 {
		for _, p := range parts {
			for _, tok := range tokens {
				if s := p + tok; !slices.Contains(parts, s) {
					parts = append(parts, s)
				}
			}
		}
	}
	seen := map[string][2]string{}
	for _, a := range parts {
		for _, b := range parts {
			tuple := [2]string{a, b}
			do(h, "GET", "/", "192.0.2.1:1", http.Header{"X-A": {a}, "X-B": {b}})
			store.mu.Lock()
			key := store.last
			store.mu.Unlock()
			if prev, ok := seen[key]; ok && prev != tuple {
				t.Fatalf("(%.12q…, %.12q…) and (%.12q…, %.12q…) share the key %.40q…", prev[0], prev[1], a, b, key)
			}
			seen[key] = tuple
		}
	}
	if got, want := len(seen), len(parts)*len(parts); got != want {
		t.Errorf("%d distinct keys for %d tuples", got, want)
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
				Policies: []enforce.Policy{{Name: "hourly", Limit: tollgate.PerHour(1)}},
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

// TestConcurrentKeysApart: requests decided at the same time, from several
// goroutines, each spend their own key's counter and no other, whatever
// their keys' lengths: short, longer than the room a key is first built in,
// and longer than a store key, hashed. Every key has a burst of five and
// gets exactly five requests, all admitted; a sixth is then denied. A key
// built in a buffer another request was still using would put a request on
// the wrong counter: one key would be denied early, another admit a sixth;
// under the race detector (go test -race), the sharing itself fails the
// test even when no request lands on the wrong counter.
func TestConcurrentKeysApart(t *testing.T) {
	t.Parallel()
	const perKey = 5
	c := newClock() // no refill while the test runs
	lim := mustNew(t, memorystore.New(memorystore.WithClock(c.Now)), []httplimit.Rule{{
		Name:     "api",
		Key:      httplimit.Header("X-API-Key"),
		Policies: []enforce.Policy{{Name: "burst", Limit: tollgate.Limit{Rate: perKey, Period: time.Hour, Burst: perKey}}},
	}})
	h := lim.Handler(okHandler)
	var keys []string
	for i, n := range []int{1, 8, 40, 150, 200, 400, 600, 2000} {
		for j := range 4 {
			// Keys of one length differ at the start and at the end.
			keys = append(keys, strconv.Itoa(i)+strconv.Itoa(j)+strings.Repeat("k", n)+strconv.Itoa(j))
		}
	}
	jobs := make(chan string)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		denied = map[string]int{}
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range jobs {
				if w := do(h, "GET", "/", "192.0.2.1:1", http.Header{"X-Api-Key": {k}}); w.Code != http.StatusOK {
					mu.Lock()
					denied[k]++
					mu.Unlock()
				}
			}
		}()
	}
	for range perKey {
		for _, i := range rand.Perm(len(keys)) {
			jobs <- keys[i]
		}
	}
	close(jobs)
	wg.Wait()
	for k, n := range denied {
		t.Errorf("key of %d bytes: %d of its %d requests denied, want none", len(k), n, perKey)
	}
	for _, k := range keys {
		if w := do(h, "GET", "/", "192.0.2.1:1", http.Header{"X-Api-Key": {k}}); w.Code != http.StatusTooManyRequests {
			t.Errorf("key of %d bytes: request %d answered %d, want 429", len(k), perKey+1, w.Code)
		}
	}
}
