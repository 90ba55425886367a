package permit_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/store/permit"
)

func TestCheckAcquire(t *testing.T) {
	t.Parallel()
	long := string(make([]byte, tollgate.MaxKeyLen+1))
	for _, tc := range []struct {
		name  string
		key   string
		max   int
		lease time.Duration
		want  int64 // µs
		err   error
	}{
		{"smallest", "k", 1, tollgate.MinLease, 1000, nil},
		{"largest", "k", tollgate.MaxConcurrency, tollgate.MaxLease, int64(tollgate.MaxLease / time.Microsecond), nil},
		{"lease rounded up", "k", 3, time.Second + 1, 1_000_001, nil},
		{"empty key", "", 1, time.Second, 0, tollgate.ErrInvalidKey},
		{"long key", long, 1, time.Second, 0, tollgate.ErrInvalidKey},
		{"max 0", "k", 0, time.Second, 0, tollgate.ErrInvalidLimit},
		{"max too large", "k", tollgate.MaxConcurrency + 1, time.Second, 0, tollgate.ErrInvalidLimit},
		{"lease too short", "k", 1, tollgate.MinLease - time.Microsecond, 0, tollgate.ErrInvalidLimit},
		{"lease too long", "k", 1, tollgate.MaxLease + time.Microsecond, 0, tollgate.ErrInvalidLimit},
		{"negative lease", "k", 1, -time.Second, 0, tollgate.ErrInvalidLimit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := permit.CheckAcquire(tc.key, tc.max, tc.lease)
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if want := tc.want; got != want {
				t.Errorf("lease = %dµs, want %d", got, want)
			}
		})
	}
}

func TestCheckPermit(t *testing.T) {
	t.Parallel()
	id := permit.NewID()
	for _, tc := range []struct {
		name string
		p    tollgate.Permit
		ok   bool
	}{
		{"fresh", tollgate.Permit{Key: "k", ID: id}, true},
		{"zero", tollgate.Permit{}, false},
		{"no key", tollgate.Permit{ID: id}, false},
		{"short ID", tollgate.Permit{Key: "k", ID: id[1:]}, false},
		{"long ID", tollgate.Permit{Key: "k", ID: id + "0"}, false},
		{"not hex", tollgate.Permit{Key: "k", ID: "g" + id[1:]}, false},
		{"a Lua pattern", tollgate.Permit{Key: "k", ID: "%d" + id[2:]}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := permit.Check(tc.p)
			if got, want := err == nil, tc.ok; got != want {
				t.Fatalf("err = %v, want ok %v", err, want)
			}
			if err != nil && !errors.Is(err, tollgate.ErrInvalidPermit) {
				t.Errorf("err = %v, want ErrInvalidPermit", err)
			}
		})
	}
}

func TestNewPermitIDUnique(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 10_000 {
		id := permit.NewID()
		if err := permit.Check(tollgate.Permit{Key: "k", ID: id}); err != nil {
			t.Fatal(err)
		}
		if seen[id] {
			t.Fatalf("%s drawn twice", id)
		}
		seen[id] = true
	}
}
