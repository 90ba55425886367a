package redisstore

import (
	"context"
	"fmt"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/store/exact"
)

// SettleN implements tollgate.Settler: one call of lua/settle.lua (or of
// the function library's settle function, once Load loaded it) corrects
// key's state under limit by actual − reserved, atomically, for the
// reservation ReserveN made at the time at, and returns the key's state
// after the correction as a look (n = 0) reports it. The settle is made at
// the store's clock, as a decision is: the Redis server's TIME, or the
// WithClock value. Its arguments are checked with tollgate.CheckSettle
// before anything is sent, and a settle of actual equal to reserved writes
// nothing, only looks.
//
// Settles are not pipelined (WithPipeline gathers decisions only): they
// come once per request, after the response, off the path of its
// admission.
func (s *Store) SettleN(ctx context.Context, key string, limit tollgate.Limit, at int64, reserved, actual int) (tollgate.Result, error) {
	res, _, err := s.settle(ctx, key, limit, at, reserved, actual)
	return res, err
}

// settle is SettleN that also returns the time the settle was made at (µs).
func (s *Store) settle(ctx context.Context, key string, limit tollgate.Limit, at int64, reserved, actual int) (tollgate.Result, int64, error) {
	p, d, err := tollgate.CheckSettle(key, limit, at, reserved, actual)
	if err != nil {
		return tollgate.Result{Limit: limit}, 0, fmt.Errorf("redisstore: %w", err)
	}
	now, err := s.clock()
	if err != nil {
		return tollgate.Result{Limit: limit}, 0, err
	}
	keys := []string{s.Key(key, limit)}
	args := settleArgs(p, at, d, now)
	var reply any
	if s.fn.Load() {
		reply, err = s.client.FCall(ctx, settleFn, keys, args...).Result()
		if err != nil && isMissingFunction(err) {
			s.fn.Store(false)
			reply, err = settleScript.Run(ctx, s.client, keys, args...).Result()
		}
	} else {
		reply, err = settleScript.Run(ctx, s.client, keys, args...).Result()
	}
	// Errors name the algorithm, never the key (see result).
	if err != nil {
		s.failed(err)
		return tollgate.Result{Limit: limit}, 0, fmt.Errorf("redisstore: settle %s: %w", limit.Algorithm, err)
	}
	return s.result(limit, reply, nil)
}

// settleArgs returns lua/settle.lua's arguments (ARGV) for a settle of the
// checked limit p by d, of a reservation made at at; now is the time in µs,
// or "" for the server's. The last four are the limit as the algorithm's
// own script gets it, without the cost and the time, padded to four.
func settleArgs(p tollgate.Params, at, d int64, now string) []any {
	args := []any{keyNames[p.Algorithm], now, at, d, p.Capacity + p.MaxDebt}
	switch p.Algorithm {
	case tollgate.TokenBucket:
		return append(args, p.UnitRate, p.Unit, p.Burst, p.MaxDebt)
	case tollgate.GCRA:
		return append(args, p.UnitRate, p.Unit, p.Burst, "")
	case tollgate.LeakyBucket:
		return append(args, p.UnitRate, p.Unit, p.Burst, p.MaxDelayUS)
	case tollgate.SlidingWindowCounter:
		return append(args, p.Rate, p.PeriodUS, exact.SlidingGrain(p.PeriodUS), "")
	default: // FixedWindow, SlidingWindowLog
		return append(args, p.Rate, p.PeriodUS, "", "")
	}
}
