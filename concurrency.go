package tollgate

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// ConcurrencyStore limits how many requests on a key are in flight at once,
// across every process sharing the store: "at most 5 concurrent exports per
// tenant". A rate limit bounds how often requests start; a concurrency limit
// bounds how many run, which is what protects a slow endpoint (a report, an
// export, a long model completion) whose cost is its duration. A semaphore in
// each pod's memory multiplies the limit by the number of pods; this one is
// shared.
//
// Each admitted request holds a Permit, a slot leased for a while: the holder
// releases it when done (Release) and, when the work may outlast the lease,
// extends it (Renew). A permit that is neither released nor renewed lapses
// when its lease ends, so a holder that crashed gives its slot back within
// one lease instead of leaking it for good. The lease is that trade-off: long
// enough to cover the work (or a renewal period), short enough that a
// crashed pod's slots come back soon.
//
// Every call is one atomic decision against the key's permits, as if calls
// from every process were made one after the other; lapsed permits are
// dropped on each call. Being at the limit is a ConcurrencyResult with
// Allowed false, never an error; errors are for invalid input and for a
// store that cannot answer.
//
// redisstore.Store implements it for a limit shared by every replica,
// memorystore.Concurrency for one process.
type ConcurrencyStore interface {
	// Acquire takes one of max slots on key for lease, if one is free. On
	// success the Permit identifies the slot; on a denial it is the zero
	// Permit and the result's RetryAfter says when a slot frees up if no
	// holder releases one first. max may change between calls: a lowered
	// max admits no one until enough permits are gone, and takes none away.
	Acquire(ctx context.Context, key string, max int, lease time.Duration) (Permit, ConcurrencyResult, error)
	// AcquireID is Acquire for a permit whose ID the caller names (32
	// lowercase hex digits, as PermitID makes from a request's own ID), so
	// that a process that knows only that name — another replica, the
	// second call of a gateway — can release it without having been handed
	// the Permit. An ID the key already holds is not taken again: the call
	// is denied, its RetryAfter running until that permit's lease ends, so
	// that two requests under one name never share one slot. An invalid ID
	// is ErrInvalidPermit.
	AcquireID(ctx context.Context, key, id string, max int, lease time.Duration) (Permit, ConcurrencyResult, error)
	// Release gives the permit's slot back at once. Releasing a permit that
	// is already released or has lapsed does nothing and is not an error,
	// so a deferred Release is always safe. Give it a context that the
	// request's end does not cancel (context.WithoutCancel), or a remote
	// store cannot be told and the slot stays taken until its lease ends.
	Release(ctx context.Context, p Permit) error
	// Renew extends a held permit to lease from now (which may also shorten
	// it) and returns it with its new Expires. A permit that has lapsed is
	// gone, its slot perhaps taken by someone else: Renew then fails with
	// ErrPermitExpired and changes nothing, and the holder should stop or
	// Acquire again.
	Renew(ctx context.Context, p Permit, lease time.Duration) (Permit, error)
}

// Permit is a held slot of a concurrency limit. It is a plain value: it can
// be copied, logged (its ID is random, not a secret that grants anything
// beyond releasing or renewing this one slot) or handed to another process,
// which may release or renew it.
type Permit struct {
	// Key is the key the slot was taken on.
	Key string
	// ID identifies the permit among the key's holders: 128 random bits in
	// 32 hex digits, unique across processes.
	ID string
	// Expires is when the permit lapses unless renewed, by the store's
	// clock (the Redis server's, for redisstore).
	Expires time.Time
}

// ConcurrencyResult is the outcome of one Acquire.
type ConcurrencyResult struct {
	// Allowed reports whether a slot was taken.
	Allowed bool
	// Max is the limit the decision was made under.
	Max int
	// Remaining is how many slots are free after this decision.
	Remaining int
	// RetryAfter is, when denied, how long until a slot frees up by a lease
	// ending, if no holder releases one first: a fair upper bound to wait,
	// not a promise (another caller may take the slot). Holders usually
	// release long before their lease ends, so callers whose requests are
	// short retry sooner, with a small random backoff. 0 when allowed.
	RetryAfter time.Duration
}

// Bounds of a concurrency limit, checked by CheckAcquire.
const (
	// MaxConcurrency is the largest max a key accepts. A key keeps one entry
	// per held permit, so it bounds the memory of a key (in Redis, roughly
	// 100 bytes a permit) and the work of dropping lapsed permits.
	MaxConcurrency = 10_000
	// MinLease is the shortest lease: Redis counts key lifetimes in
	// milliseconds.
	MinLease = time.Millisecond
	// MaxLease is the longest lease, which is also the longest a crashed
	// holder's slot can stay taken. Work that runs longer renews.
	MaxLease = 24 * time.Hour
)

var (
	// ErrPermitExpired: Renew found the permit lapsed (or released): its
	// slot is no longer held.
	ErrPermitExpired = errors.New("tollgate: permit expired")
	// ErrInvalidPermit: a Permit with an invalid key or ID, which no store
	// ever returned.
	ErrInvalidPermit = errors.New("tollgate: invalid permit")
)

// CheckAcquire validates an Acquire the way every ConcurrencyStore does
// before it touches any state, and returns the lease in whole microseconds,
// rounded up. The key must be 1 to MaxKeyLen bytes (ErrInvalidKey), max 1 to
// MaxConcurrency and the lease MinLease to MaxLease (ErrInvalidLimit).
func CheckAcquire(key string, max int, lease time.Duration) (int64, error) {
	if err := checkKey(key); err != nil {
		return 0, err
	}
	if max < 1 || max > MaxConcurrency {
		return 0, fmt.Errorf("%w: max concurrent must be 1 to %d, got %d", ErrInvalidLimit, MaxConcurrency, max)
	}
	return CheckLease(lease)
}

// CheckLease validates a lease (MinLease to MaxLease, else ErrInvalidLimit)
// and returns it in whole microseconds, rounded up: a lease is never
// shorter than asked.
func CheckLease(lease time.Duration) (int64, error) {
	if lease < MinLease || lease > MaxLease {
		return 0, fmt.Errorf("%w: a lease must be %v to %v, got %v", ErrInvalidLimit, MinLease, MaxLease, lease)
	}
	return int64((lease + time.Microsecond - 1) / time.Microsecond), nil
}

// CheckPermit validates a Permit before Release or Renew: a valid key and an
// ID of 32 lowercase hex digits, as NewPermitID and PermitID make
// (ErrInvalidPermit).
func CheckPermit(p Permit) error {
	if err := checkKey(p.Key); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidPermit, err)
	}
	return checkID(p.ID)
}

// CheckAcquireID validates an AcquireID as CheckAcquire does, and its ID
// as CheckPermit does.
func CheckAcquireID(key, id string, max int, lease time.Duration) (int64, error) {
	leaseUS, err := CheckAcquire(key, max, lease)
	if err != nil {
		return 0, err
	}
	return leaseUS, checkID(id)
}

func checkID(id string) error {
	if len(id) != 32 {
		return fmt.Errorf("%w: an ID is 32 hex digits, got %d bytes", ErrInvalidPermit, len(id))
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return fmt.Errorf("%w: an ID is 32 lowercase hex digits", ErrInvalidPermit)
		}
	}
	return nil
}

// PermitID returns the permit ID that name stands for: the first 128 bits
// of its SHA-256, in 32 hex digits. Every process computes the same ID
// from the same name, so a request's own identifier (Envoy's
// x-request-id) names its permit on every replica, at the start of the
// request and at its end. Names are hashed rather than used as they are so
// that any string, however long, makes a valid ID; two names sharing an ID
// are as likely as two random IDs colliding. Anyone who can choose the
// name can choose the ID: take names from something the clients do not
// control.
func PermitID(name string) string {
	sum := sha256.Sum256([]byte(name))
	return hex.EncodeToString(sum[:16])
}

// NewPermitID returns a fresh permit ID: 128 bits from crypto/rand in 32
// hex digits. Random IDs need no coordination between processes, and two
// holders drawing the same one is as likely as guessing a 128-bit key.
func NewPermitID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand crashes the program rather)
	return hex.EncodeToString(b[:])
}

func checkKey(key string) error {
	if len(key) == 0 || len(key) > MaxKeyLen {
		return fmt.Errorf("%w: a key must be 1 to %d bytes, got %d", ErrInvalidKey, MaxKeyLen, len(key))
	}
	return nil
}
