package redisstore

import (
	"context"
	"fmt"

	"github.com/tollgate/tollgate"
)

var _ tollgate.Combiner = (*Store)(nil)

// AllowAll implements tollgate.Combiner with one call of lua/all.lua (the
// function library's, once Load has loaded it): the script asks each
// limit's own decide what it would decide without writing, then decides n
// under every limit, or under none. Every limit's key has key as its hash
// tag, so the call is one Cluster slot. It is sent on its own, never
// gathered into a pipeline. Invalid input is rejected before anything is
// sent to Redis.
func (s *Store) AllowAll(ctx context.Context, key string, limits []tollgate.Limit, n int, dst []tollgate.Result) ([]tollgate.Result, error) {
	var pbuf [4]tollgate.Params
	ps, err := tollgate.CheckAll(key, limits, n, pbuf[:0])
	if err != nil {
		return dst, fmt.Errorf("redisstore: %w", err)
	}
	now, err := s.clock()
	if err != nil {
		return dst, err
	}
	keys := make([]string, len(ps))
	args := make([]any, 0, 2+len(ps)*10)
	args = append(args, now, n)
	for i := range ps {
		keys[i] = s.Key(key, limits[i])
		if ps[i].Calendar != nil {
			args = append(args, "cal")
			if args, err = s.calendarArgs(ps[i], n, args); err != nil {
				return dst, err
			}
			continue
		}
		args = append(args, keyNames[ps[i].Algorithm])
		args = append(args, scriptArgs(ps[i], n, now)...)
	}
	reply, err := s.runAll(ctx, keys, args)
	if err != nil {
		s.failed(err)
		return dst, fmt.Errorf("redisstore: all: %w", err)
	}
	arr, ok := reply.([]any)
	if !ok || len(arr) != len(ps) {
		return dst, fmt.Errorf("redisstore: all: unexpected reply %T, want %d replies", reply, len(ps))
	}
	for i, r := range arr {
		res, _, err := s.result(limits[i], r, nil)
		if err != nil {
			return dst, err
		}
		dst = append(dst, res)
	}
	return dst, nil
}

// runAll calls lua/all.lua: the library's function when it is loaded,
// else its script.
func (s *Store) runAll(ctx context.Context, keys []string, args []any) (any, error) {
	if s.fn.Load() {
		reply, err := s.client.FCall(ctx, allFn, keys, args...).Result()
		if err == nil || !isMissingFunction(err) {
			return reply, err
		}
		s.fn.Store(false)
	}
	return allScript.Run(ctx, s.client, keys, args...).Result()
}
