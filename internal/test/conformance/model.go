package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/model"
)

// ModelStore is a tollgate.Store that decides with the reference model in
// internal/test/model, reading time from a clock: the model as a Backend, so
// the hand-computed scenarios check the oracle too. It validates requests
// as every Store does (tollgate.CheckRequest) before asking the model.
type ModelStore struct {
	mu  sync.Mutex
	m   *model.Model
	now func() time.Time
}

var _ tollgate.Settler = (*ModelStore)(nil)

// NewModelStore returns a ModelStore that has seen no key.
func NewModelStore(now func() time.Time) *ModelStore {
	return &ModelStore{m: model.New(), now: now}
}

func stateName(key string, l tollgate.Limit) string {
	return fmt.Sprintf("%s\x00%d\x00%d\x00%s\x00%s", key, l.Algorithm, l.Period, l.Calendar.Unit, l.Calendar.Zone)
}

// AllowN implements tollgate.Store.
func (s *ModelStore) AllowN(ctx context.Context, key string, limit tollgate.Limit, n int) (tollgate.Result, error) {
	if _, err := tollgate.CheckRequest(key, limit, n); err != nil {
		return tollgate.Result{Limit: limit}, fmt.Errorf("conformance: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	r, err := s.m.AllowN(key, limit, n, now.UnixMicro())
	if err != nil {
		return r, fmt.Errorf("conformance: %w", err)
	}
	return r, nil
}

// ReserveN implements tollgate.Settler.
func (s *ModelStore) ReserveN(ctx context.Context, key string, limit tollgate.Limit, n int) (tollgate.Result, int64, error) {
	if _, err := tollgate.CheckRequest(key, limit, n); err != nil {
		return tollgate.Result{Limit: limit}, 0, fmt.Errorf("conformance: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now().UnixMicro()
	r, err := s.m.AllowN(key, limit, n, now)
	if err != nil {
		return r, now, fmt.Errorf("conformance: %w", err)
	}
	return r, now, nil
}

// SettleN implements tollgate.Settler.
func (s *ModelStore) SettleN(ctx context.Context, key string, limit tollgate.Limit, at int64, reserved, actual int) (tollgate.Result, error) {
	if _, _, err := tollgate.CheckSettle(key, limit, at, reserved, actual); err != nil {
		return tollgate.Result{Limit: limit}, fmt.Errorf("conformance: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, _, err := s.m.SettleN(key, limit, at, reserved, actual, s.now().UnixMicro())
	if err != nil {
		return r, fmt.Errorf("conformance: %w", err)
	}
	return r, nil
}

// Reset implements tollgate.Store.
func (s *ModelStore) Reset(ctx context.Context, key string, limit tollgate.Limit) error {
	if _, err := tollgate.CheckRequest(key, limit, 0); err != nil {
		return fmt.Errorf("conformance: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m.Reset(key, limit)
	return nil
}

// ModelBackend is the reference model as a Backend. Its TTL is the model's
// expiry: ResetAfter of the last call that set it, to the microsecond; a
// store whose TTLs are whole milliseconds (Redis) keeps the state up to a
// millisecond longer, in which it decides as no state.
func ModelBackend() Backend {
	return Backend{
		New: func(t *testing.T, now func() time.Time) tollgate.Store { return NewModelStore(now) },
		TTL: func(t *testing.T, s tollgate.Store, key string, limit tollgate.Limit) (time.Duration, bool) {
			ms := s.(*ModelStore)
			ms.mu.Lock()
			defer ms.mu.Unlock()
			exp, ok := ms.m.Expiry(key, limit)
			if !ok {
				return 0, false
			}
			return time.UnixMicro(exp).Sub(ms.now()), true
		},
		TTLGrain: time.Millisecond,
	}
}

// errCost reports whether err is what a store returns for a cost the model
// refuses.
func errCost(err error) bool {
	return errors.Is(err, tollgate.ErrCostExceedsBurst) || errors.Is(err, tollgate.ErrInvalidCost)
}
