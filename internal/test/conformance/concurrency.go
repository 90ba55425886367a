package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
)

// ConcurrencyBackend is a tollgate.ConcurrencyStore under test.
type ConcurrencyBackend struct {
	// New returns a store reading time from now.
	New func(t *testing.T, now func() time.Time) tollgate.ConcurrencyStore
	// Held returns how many permits the store keeps for key, lapsed ones
	// not yet dropped included, and how long it will keep the key (0 when
	// it keeps none).
	Held func(t *testing.T, s tollgate.ConcurrencyStore, key string, now time.Time) (int, time.Duration)
	// TTLSlack and TTLGrain are as in Backend.
	TTLSlack, TTLGrain time.Duration
	// StepsBack says the store's key lifetimes follow the test's clock
	// (memory), so ConcurrencyModel may step it back. Redis expires keys in
	// real time, so there the clock only moves forward.
	StepsBack bool
	// Keep, for a store whose keys expire in real time (Redis), makes key
	// outlive the test. ConcurrencyModel calls it after every call on key:
	// the test's clock is read before a call and the key's TTL starts when
	// the script runs, so a call delayed more than the one that set the TTL
	// could find the key gone in real time while the test's clock still
	// counts its last permit as live. Kept, a key's permits lapse by the
	// test's clock alone, as the model's do.
	Keep func(t *testing.T, s tollgate.ConcurrencyStore, key string)
}

// op is what a concurrency step does.
type op uint8

const (
	acquire op = iota
	release
	renew
	acquireNamed // AcquireID, the permit named by PermitID(name)
	releaseNamed // Release of the permit PermitID(name), made from the name alone
)

// cstep is one call at T0+at. Permits are numbered in the order they were
// granted: permit 0 is the scenario's first admitted Acquire.
type cstep struct {
	at     time.Duration
	op     op
	max    int           // acquire
	lease  time.Duration // acquire, renew
	permit int           // release, renew
	name   string        // acquireNamed, releaseNamed
	// want is an Acquire's result (Max is filled in), or for a renewal
	// Allowed false when it must fail with ErrPermitExpired.
	want tollgate.ConcurrencyResult
	// held, when ≥ 0, is how many permits the key must then hold, and ttl
	// how long it must then be kept.
	held int
	ttl  time.Duration
}

func acq(at time.Duration, max int, lease time.Duration, remaining int) cstep {
	return cstep{at: at, max: max, lease: lease, held: -1, want: tollgate.ConcurrencyResult{Allowed: true, Remaining: remaining}}
}

func full(at time.Duration, max int, lease, retry time.Duration) cstep {
	return cstep{at: at, max: max, lease: lease, held: -1, want: tollgate.ConcurrencyResult{RetryAfter: retry}}
}

func rel(at time.Duration, permit int) cstep {
	return cstep{at: at, op: release, permit: permit, held: -1}
}

func ren(at time.Duration, permit int, lease time.Duration, held bool) cstep {
	return cstep{at: at, op: renew, permit: permit, lease: lease, held: -1, want: tollgate.ConcurrencyResult{Allowed: held}}
}

// named makes an acquire step (acq or full) an AcquireID of the permit
// named name.
func named(st cstep, name string) cstep {
	st.op, st.name = acquireNamed, name
	return st
}

func relNamed(at time.Duration, name string) cstep {
	return cstep{at: at, op: releaseNamed, name: name, held: -1}
}

// holding adds a check of what the key holds after the step.
func holding(st cstep, n int, ttl time.Duration) cstep {
	st.held, st.ttl = n, ttl
	return st
}

type cscenario struct {
	name  string
	steps []cstep
}

const sec = time.Second

func concurrencyScenarios() []cscenario {
	return []cscenario{
		{"fill, deny, a release frees a slot", []cstep{
			holding(acq(0, 2, 10*sec, 1), 1, 10*sec),
			holding(acq(1*sec, 2, 10*sec, 0), 2, 10*sec),
			full(2*sec, 2, 10*sec, 8*sec), // the earliest lease ends at 10 s
			holding(full(2*sec, 2, 10*sec, 8*sec), 2, 9*sec),
			holding(rel(3*sec, 0), 1, 8*sec),
			holding(acq(3*sec, 2, 10*sec, 0), 2, 10*sec),
			full(4*sec, 2, 10*sec, 7*sec), // now permit 1, ending at 11 s
		}},
		{"a crashed holder's slot comes back after its lease", []cstep{
			acq(0, 1, 5*sec, 0),
			full(5*sec-us, 1, 5*sec, us),
			holding(acq(5*sec, 1, 5*sec, 0), 1, 5*sec), // a lease ending now has ended
			ren(5*sec, 0, 5*sec, false),                // and is never brought back
			rel(5*sec, 0),                              // releasing it changes nothing
			holding(full(6*sec, 1, 5*sec, 4*sec), 1, 4*sec),
		}},
		{"renew extends and shortens from now", []cstep{
			acq(0, 1, 5*sec, 0),
			holding(ren(4*sec, 0, 5*sec, true), 1, 5*sec), // now ends at 9 s
			full(8*sec, 1, 5*sec, 1*sec),
			holding(ren(8*sec, 0, 500*ms, true), 1, 500*ms), // now ends at 8.5 s
			acq(8500*ms, 1, 5*sec, 0),
			ren(8500*ms, 0, 5*sec, false),
			ren(9*sec, 1, 5*sec, true),
		}},
		{"a lowered max waits for enough leases", []cstep{
			acq(0, 3, 10*sec, 2),
			acq(1*sec, 3, 10*sec, 1),
			acq(2*sec, 3, 10*sec, 0),
			full(3*sec, 1, 10*sec, 9*sec), // three held, max 1: the third lease (12 s) must end
			full(3*sec, 2, 10*sec, 8*sec), // max 2: the second (11 s)
			rel(3*sec, 2),
			full(3*sec, 2, 10*sec, 7*sec),
			holding(acq(10*sec, 2, 10*sec, 0), 2, 10*sec), // permit 0 lapsed at 10 s
		}},
		{"a raised max admits at once", []cstep{
			acq(0, 1, 10*sec, 0),
			full(0, 1, 10*sec, 10*sec),
			acq(0, 3, 10*sec, 1),
		}},
		{"release twice", []cstep{
			acq(0, 1, 10*sec, 0),
			rel(1*sec, 0),
			holding(rel(1*sec, 0), 0, 0),
			acq(2*sec, 1, 10*sec, 0),
			holding(rel(3*sec, 0), 1, 9*sec), // the old permit does not release the new one
		}},
		{"the key lives as long as its latest lease", []cstep{
			holding(acq(0, 3, 10*sec, 2), 1, 10*sec),
			holding(acq(1*sec, 3, 2*sec, 1), 2, 9*sec),
			holding(rel(2*sec, 0), 1, 1*sec),
			holding(acq(3*sec, 3, 10*sec, 2), 1, 10*sec), // permit 1 lapsed and was dropped
		}},
		{"a clock that steps back keeps leases longer", []cstep{
			acq(5*sec, 1, 10*sec, 0),
			full(2*sec, 1, 10*sec, 13*sec),
			acq(15*sec, 1, 10*sec, 0),
		}},
		{"a denial stores nothing", []cstep{
			acq(0, 2, 10*sec, 1),
			acq(0, 2, 10*sec, 0),
			full(0, 2, 10*sec, 10*sec),
			full(0, 2, 10*sec, 10*sec),
			holding(full(0, 2, 10*sec, 10*sec), 2, 10*sec),
		}},
		// Redis expires keys in real time while the test's clock stands
		// still, so a short lease is only seen to end, not to hold.
		{"a named permit is released by its name alone", []cstep{
			holding(named(acq(0, 2, 10*sec, 1), "req-a"), 1, 10*sec),
			named(acq(1*sec, 2, 10*sec, 0), "req-b"),
			named(full(2*sec, 2, 10*sec, 8*sec), "req-c"),
			holding(relNamed(3*sec, "req-a"), 1, 8*sec),
			named(acq(3*sec, 2, 10*sec, 0), "req-c"),
			relNamed(4*sec, "req-unknown"), // names nothing held: changes nothing
			named(full(4*sec, 2, 10*sec, 7*sec), "req-d"),
		}},
		{"a name held is not taken twice", []cstep{
			named(acq(0, 3, 10*sec, 2), "req-a"),
			holding(named(full(2*sec, 3, 10*sec, 8*sec), "req-a"), 1, 8*sec), // until its own lease ends
			acq(2*sec, 3, 10*sec, 1),                                         // other permits still fit
			relNamed(3*sec, "req-a"),
			holding(named(acq(3*sec, 3, 10*sec, 1), "req-a"), 2, 10*sec), // released: the name is free again
		}},
		{"a named permit lapses like any other", []cstep{
			named(acq(0, 1, 5*sec, 0), "req-a"),
			named(full(4*sec, 1, 5*sec, 1*sec), "req-b"),
			named(acq(5*sec, 1, 5*sec, 0), "req-b"), // the lost release came back after the lease
			relNamed(6*sec, "req-a"),                // late: its slot is req-b's, and stays so
			holding(named(full(6*sec, 1, 5*sec, 4*sec), "req-c"), 1, 4*sec),
			named(acq(6*sec, 2, 5*sec, 0), "req-a"), // the lapsed name may be taken again
		}},
		{"the shortest lease", []cstep{
			acq(0, 1, tollgate.MinLease, 0),
			acq(tollgate.MinLease, 1, tollgate.MinLease, 0),
		}},
		{"a lease is rounded up to whole microseconds", []cstep{
			acq(0, 1, 10*sec+1, 0),
			full(10*sec, 1, 10*sec, us),
			acq(10*sec+us, 1, 10*sec, 0),
		}},
	}
}

// RunConcurrency runs every concurrency scenario against b, and checks that
// invalid input is refused and changes nothing.
func RunConcurrency(t *testing.T, b ConcurrencyBackend) {
	clock := NewClock()
	store := b.New(t, clock.Now)
	ctx := context.Background()
	for i, sc := range concurrencyScenarios() {
		t.Run(sc.name, func(t *testing.T) {
			key := fmt.Sprintf("conformance:conc:%d:%d", i, rand.Int64())
			var permits []tollgate.Permit
			for j, st := range sc.steps {
				clock.Set(st.at)
				what := fmt.Sprintf("step %d (at %v, %v)", j, st.at, st)
				switch st.op {
				case acquire, acquireNamed:
					var (
						p   tollgate.Permit
						got tollgate.ConcurrencyResult
						err error
					)
					if st.op == acquire {
						p, got, err = store.Acquire(ctx, key, st.max, st.lease)
					} else {
						p, got, err = store.AcquireID(ctx, key, tollgate.PermitID(st.name), st.max, st.lease)
					}
					if err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					want := st.want
					want.Max = st.max
					if got != want {
						t.Fatalf("%s:\n got %+v\nwant %+v", what, got, want)
					}
					if got.Allowed {
						lease := (st.lease + us - 1) / us * us
						if got, want := p.Expires, clock.Now().Add(lease); !got.Equal(want) || p.Key != key || len(p.ID) != 32 {
							t.Fatalf("%s: permit %+v, want one on %q expiring at %v", what, p, key, want)
						}
						if st.op == acquireNamed && p.ID != tollgate.PermitID(st.name) {
							t.Fatalf("%s: permit ID %s, want %s", what, p.ID, tollgate.PermitID(st.name))
						}
						permits = append(permits, p)
					} else if p != (tollgate.Permit{}) {
						t.Fatalf("%s: denied with permit %+v, want the zero Permit", what, p)
					}
				case release:
					if err := store.Release(ctx, permits[st.permit]); err != nil {
						t.Fatalf("%s: %v", what, err)
					}
				case releaseNamed:
					if err := store.Release(ctx, tollgate.Permit{Key: key, ID: tollgate.PermitID(st.name)}); err != nil {
						t.Fatalf("%s: %v", what, err)
					}
				case renew:
					p, err := store.Renew(ctx, permits[st.permit], st.lease)
					switch {
					case st.want.Allowed && err != nil:
						t.Fatalf("%s: %v", what, err)
					case !st.want.Allowed && !errors.Is(err, tollgate.ErrPermitExpired):
						t.Fatalf("%s: err = %v, want ErrPermitExpired", what, err)
					case st.want.Allowed && !p.Expires.Equal(clock.Now().Add(st.lease)):
						t.Fatalf("%s: renewed to expire at %v, want %v", what, p.Expires, clock.Now().Add(st.lease))
					}
				}
				if st.held >= 0 {
					checkHeld(t, b, store, key, clock.Now(), st.held, st.ttl)
				}
			}
		})
	}
	t.Run("keys are independent", func(t *testing.T) {
		clock.Set(0)
		a, c := fmt.Sprintf("conformance:conc:a:%d", rand.Int64()), fmt.Sprintf("conformance:conc:b:%d", rand.Int64())
		for _, k := range []string{a, c} {
			if _, got, err := store.Acquire(ctx, k, 1, 10*sec); err != nil || !got.Allowed {
				t.Fatalf("Acquire(%s) = %+v, %v; want allowed", k, got, err)
			}
		}
	})
	t.Run("invalid input changes nothing", func(t *testing.T) { invalidConcurrency(t, store, clock) })
}

func (st cstep) String() string {
	switch st.op {
	case release:
		return fmt.Sprintf("release permit %d", st.permit)
	case renew:
		return fmt.Sprintf("renew permit %d for %v", st.permit, st.lease)
	case acquireNamed:
		return fmt.Sprintf("acquire %q max %d lease %v", st.name, st.max, st.lease)
	case releaseNamed:
		return fmt.Sprintf("release %q", st.name)
	}
	return fmt.Sprintf("acquire max %d lease %v", st.max, st.lease)
}

// checkHeld requires key to hold n permits, kept for ttl (rounded up to the
// store's grain, less its slack).
func checkHeld(t *testing.T, b ConcurrencyBackend, s tollgate.ConcurrencyStore, key string, now time.Time, n int, ttl time.Duration) {
	t.Helper()
	got, gotTTL := b.Held(t, s, key, now)
	if got != n {
		t.Fatalf("key holds %d permits, want %d", got, n)
	}
	hi := ttl
	if b.TTLGrain > 0 {
		hi = (ttl + b.TTLGrain - 1) / b.TTLGrain * b.TTLGrain
	}
	if gotTTL > hi || gotTTL < ttl-b.TTLSlack {
		t.Fatalf("key kept for %v, want %v", gotTTL, hi)
	}
}

func invalidConcurrency(t *testing.T, s tollgate.ConcurrencyStore, clock *Clock) {
	ctx := context.Background()
	clock.Set(0)
	key := fmt.Sprintf("conformance:conc:invalid:%d", rand.Int64())
	long := string(make([]byte, tollgate.MaxKeyLen+1))
	for _, tc := range []struct {
		name  string
		key   string
		max   int
		lease time.Duration
		want  error
	}{
		{"empty key", "", 1, sec, tollgate.ErrInvalidKey},
		{"key too long", long, 1, sec, tollgate.ErrInvalidKey},
		{"max 0", key, 0, sec, tollgate.ErrInvalidLimit},
		{"negative max", key, -1, sec, tollgate.ErrInvalidLimit},
		{"max above MaxConcurrency", key, tollgate.MaxConcurrency + 1, sec, tollgate.ErrInvalidLimit},
		{"zero lease", key, 1, 0, tollgate.ErrInvalidLimit},
		{"lease below MinLease", key, 1, tollgate.MinLease - 1, tollgate.ErrInvalidLimit},
		{"lease above MaxLease", key, 1, tollgate.MaxLease + 1, tollgate.ErrInvalidLimit},
	} {
		p, res, err := s.Acquire(ctx, tc.key, tc.max, tc.lease)
		if !errors.Is(err, tc.want) || res.Allowed || p != (tollgate.Permit{}) {
			t.Errorf("Acquire %s: %+v, %+v, %v; want %v", tc.name, p, res, err, tc.want)
		}
	}
	for _, tc := range []struct{ name, id string }{
		{"empty ID", ""},
		{"short ID", "0123456789abcdef0123456789abcde"},
		{"upper-case ID", "0123456789ABCDEF0123456789abcdef"},
		{"a name, not an ID", "req-0123456789abcdef0123456789ab"},
	} {
		p, res, err := s.AcquireID(ctx, key, tc.id, 1, sec)
		if !errors.Is(err, tollgate.ErrInvalidPermit) || res.Allowed || p != (tollgate.Permit{}) {
			t.Errorf("AcquireID %s: %+v, %+v, %v; want ErrInvalidPermit", tc.name, p, res, err)
		}
	}
	if _, _, err := s.AcquireID(ctx, "", tollgate.PermitID("x"), 1, sec); !errors.Is(err, tollgate.ErrInvalidKey) {
		t.Errorf("AcquireID with no key: %v, want ErrInvalidKey", err)
	}
	// A real permit, to renew and release with broken copies of it.
	good, res, err := s.Acquire(ctx, key, 1, sec)
	if err != nil || !res.Allowed {
		t.Fatalf("Acquire: %+v, %v", res, err)
	}
	for _, tc := range []struct {
		name string
		p    tollgate.Permit
	}{
		{"empty ID", tollgate.Permit{Key: key}},
		{"short ID", tollgate.Permit{Key: key, ID: good.ID[:31]}},
		{"upper-case ID", tollgate.Permit{Key: key, ID: "0123456789ABCDEF0123456789abcdef"}},
		{"no key", tollgate.Permit{ID: good.ID}},
		{"key too long", tollgate.Permit{Key: long, ID: good.ID}},
	} {
		if err := s.Release(ctx, tc.p); !errors.Is(err, tollgate.ErrInvalidPermit) {
			t.Errorf("Release %s: %v, want ErrInvalidPermit", tc.name, err)
		}
		if _, err := s.Renew(ctx, tc.p, sec); !errors.Is(err, tollgate.ErrInvalidPermit) {
			t.Errorf("Renew %s: %v, want ErrInvalidPermit", tc.name, err)
		}
	}
	for _, lease := range []time.Duration{0, tollgate.MinLease - 1, tollgate.MaxLease + 1} {
		if _, err := s.Renew(ctx, good, lease); !errors.Is(err, tollgate.ErrInvalidLimit) {
			t.Errorf("Renew for %v: %v, want ErrInvalidLimit", lease, err)
		}
	}
	// None of that released, renewed or took anything.
	if got, err := s.Renew(ctx, good, sec); err != nil || !got.Expires.Equal(good.Expires) {
		t.Errorf("after rejected calls, Renew = %+v, %v; want the permit held, expiring at %v", got, err, good.Expires)
	}
	if _, res, err := s.Acquire(ctx, key, 2, sec); err != nil || !res.Allowed || res.Remaining != 0 {
		t.Errorf("after rejected calls: %+v, %v; want one permit held of 2", res, err)
	}
}
