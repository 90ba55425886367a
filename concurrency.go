package tollgate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
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
// memorystore.Store for one process.
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

// Bounds of a concurrency limit, which every ConcurrencyStore checks.
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
