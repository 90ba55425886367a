package testkit

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate"
)

// RenewCounter is a ConcurrencyStore that counts the renewals made through
// it, and how many of them failed, for tests of lease renewal.
type RenewCounter struct {
	tollgate.ConcurrencyStore
	Renewals, Failures atomic.Int64
}

// Renew renews through the store it wraps, and counts.
func (s *RenewCounter) Renew(ctx context.Context, p tollgate.Permit, lease time.Duration) (tollgate.Permit, error) {
	p, err := s.ConcurrencyStore.Renew(ctx, p, lease)
	s.Renewals.Add(1)
	if err != nil {
		s.Failures.Add(1)
	}
	return p, err
}
