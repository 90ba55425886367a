// Package permit holds what every tollgate.ConcurrencyStore checks before
// it touches any state — keys, limits, leases, permit IDs, with the same
// bounds and errors in memory and in Redis — and how a store draws a fresh
// permit ID.
package permit

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/tollgate/tollgate"
)

// CheckAcquire validates an Acquire the way every ConcurrencyStore does
// before it touches any state, and returns the lease in whole microseconds,
// rounded up. The key must be 1 to tollgate.MaxKeyLen bytes (tollgate.ErrInvalidKey), max 1 to
// tollgate.MaxConcurrency and the lease tollgate.MinLease to tollgate.MaxLease (tollgate.ErrInvalidLimit).
func CheckAcquire(key string, max int, lease time.Duration) (int64, error) {
	if err := checkKey(key); err != nil {
		return 0, err
	}
	if max < 1 || max > tollgate.MaxConcurrency {
		return 0, fmt.Errorf("%w: max concurrent must be 1 to %d, got %d", tollgate.ErrInvalidLimit, tollgate.MaxConcurrency, max)
	}
	return CheckLease(lease)
}

// CheckLease validates a lease (tollgate.MinLease to tollgate.MaxLease, else tollgate.ErrInvalidLimit)
// and returns it in whole microseconds, rounded up: a lease is never
// shorter than asked.
func CheckLease(lease time.Duration) (int64, error) {
	if lease < tollgate.MinLease || lease > tollgate.MaxLease {
		return 0, fmt.Errorf("%w: a lease must be %v to %v, got %v", tollgate.ErrInvalidLimit, tollgate.MinLease, tollgate.MaxLease, lease)
	}
	return int64((lease + time.Microsecond - 1) / time.Microsecond), nil
}

// Check validates a Permit before Release or Renew: a valid key and an
// ID of 32 lowercase hex digits, as NewID and tollgate.PermitID make
// (tollgate.ErrInvalidPermit).
func Check(p tollgate.Permit) error {
	if err := checkKey(p.Key); err != nil {
		return fmt.Errorf("%w: %w", tollgate.ErrInvalidPermit, err)
	}
	return checkID(p.ID)
}

// CheckAcquireID validates an AcquireID as CheckAcquire does, and its ID
// as Check does.
func CheckAcquireID(key, id string, max int, lease time.Duration) (int64, error) {
	leaseUS, err := CheckAcquire(key, max, lease)
	if err != nil {
		return 0, err
	}
	return leaseUS, checkID(id)
}

func checkID(id string) error {
	if len(id) != 32 {
		return fmt.Errorf("%w: an ID is 32 hex digits, got %d bytes", tollgate.ErrInvalidPermit, len(id))
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return fmt.Errorf("%w: an ID is 32 lowercase hex digits", tollgate.ErrInvalidPermit)
		}
	}
	return nil
}

// NewID returns a fresh permit ID: 128 bits from crypto/rand in 32
// hex digits. Random IDs need no coordination between processes, and two
// holders drawing the same one is as likely as guessing a 128-bit key.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand crashes the program rather)
	return hex.EncodeToString(b[:])
}

func checkKey(key string) error {
	if len(key) == 0 || len(key) > tollgate.MaxKeyLen {
		return fmt.Errorf("%w: a key must be 1 to %d bytes, got %d", tollgate.ErrInvalidKey, tollgate.MaxKeyLen, len(key))
	}
	return nil
}
