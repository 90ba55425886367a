package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/store/permit"
)

// The concurrency scripts: lua/lib.lua followed by lua/concurrency_*.lua,
// one script (one SHA) each. They are read from the same embedded files as
// the algorithms' scripts.
var (
	concAcquire = concScript("acquire")
	concRelease = concScript("release")
	concRenew   = concScript("renew")
)

func concScript(name string) *redis.Script {
	lib, err := luaFiles.ReadFile("lua/lib.lua")
	if err != nil {
		panic(err) // embedded at build time: cannot happen
	}
	body, err := luaFiles.ReadFile("lua/concurrency_" + name + ".lua")
	if err != nil {
		panic(err)
	}
	return redis.NewScript(string(lib) + "\n" + string(body))
}

var _ tollgate.ConcurrencyStore = (*Store)(nil)

// ConcurrencyKey returns the Redis key that holds key's permits: a sorted
// set named <prefix>{<key>}:conc, in the same Cluster slot as key's rate
// limits.
func (s *Store) ConcurrencyKey(key string) string {
	return s.prefix + "{" + key + "}:conc"
}

// Acquire implements tollgate.ConcurrencyStore: one script call
// (lua/concurrency_acquire.lua) drops the key's lapsed permits and adds a
// new one if fewer than max remain. Invalid input is rejected before
// anything is sent to Redis. Acquire, Release and Renew are each sent on
// their own, also with WithPipeline: they guard slow work, where a round
// trip saved is nothing.
func (s *Store) Acquire(ctx context.Context, key string, max int, lease time.Duration) (tollgate.Permit, tollgate.ConcurrencyResult, error) {
	leaseUS, err := permit.CheckAcquire(key, max, lease)
	if err != nil {
		return tollgate.Permit{}, tollgate.ConcurrencyResult{Max: max}, fmt.Errorf("redisstore: acquire: %w", err)
	}
	return s.acquire(ctx, key, permit.NewID(), max, leaseUS)
}

// AcquireID implements tollgate.ConcurrencyStore: Acquire's script call,
// with the caller's ID. The script refuses an ID the key already holds.
func (s *Store) AcquireID(ctx context.Context, key, id string, max int, lease time.Duration) (tollgate.Permit, tollgate.ConcurrencyResult, error) {
	leaseUS, err := permit.CheckAcquireID(key, id, max, lease)
	if err != nil {
		return tollgate.Permit{}, tollgate.ConcurrencyResult{Max: max}, fmt.Errorf("redisstore: acquire: %w", err)
	}
	return s.acquire(ctx, key, id, max, leaseUS)
}

// acquire runs the acquire script for the permit id, checked.
func (s *Store) acquire(ctx context.Context, key, id string, max int, leaseUS int64) (tollgate.Permit, tollgate.ConcurrencyResult, error) {
	res := tollgate.ConcurrencyResult{Max: max}
	now, err := s.clock()
	if err != nil {
		return tollgate.Permit{}, res, err
	}
	// Errors name the operation, not the key: keys hold client addresses
	// and API keys, and errors end up in logs.
	reply, err := concAcquire.Run(ctx, s.client, []string{s.ConcurrencyKey(key)}, max, leaseUS, id, now).Result()
	if err != nil {
		s.failed(err)
		return tollgate.Permit{}, res, fmt.Errorf("redisstore: acquire: %w", err)
	}
	v, err := parseInts(reply, 4)
	if err != nil || v[0] > 1 || (v[0] == 1) != (v[3] > 0) || v[1] >= int64(max) {
		return tollgate.Permit{}, res, fmt.Errorf("redisstore: acquire: unexpected reply %v", reply)
	}
	if v[0] == 0 {
		res.RetryAfter = time.Duration(v[2]) * time.Microsecond
		return tollgate.Permit{}, res, nil
	}
	res.Allowed = true
	res.Remaining = int(v[1])
	return tollgate.Permit{Key: key, ID: id, Expires: time.UnixMicro(v[3])}, res, nil
}

// Release implements tollgate.ConcurrencyStore: one script call
// (lua/concurrency_release.lua). Pass a context that is not already
// cancelled — context.WithoutCancel(ctx) in a defer — or the slot stays
// taken until the lease ends.
func (s *Store) Release(ctx context.Context, p tollgate.Permit) error {
	if err := permit.Check(p); err != nil {
		return fmt.Errorf("redisstore: release: %w", err)
	}
	now, err := s.clock()
	if err != nil {
		return err
	}
	reply, err := concRelease.Run(ctx, s.client, []string{s.ConcurrencyKey(p.Key)}, p.ID, now).Result()
	if err != nil {
		s.failed(err)
		return fmt.Errorf("redisstore: release: %w", err)
	}
	if n, ok := reply.(int64); !ok || n < 0 || n > 1 {
		return fmt.Errorf("redisstore: release: unexpected reply %v", reply)
	}
	return nil
}

// Renew implements tollgate.ConcurrencyStore: one script call
// (lua/concurrency_renew.lua).
func (s *Store) Renew(ctx context.Context, p tollgate.Permit, lease time.Duration) (tollgate.Permit, error) {
	if err := permit.Check(p); err != nil {
		return p, fmt.Errorf("redisstore: renew: %w", err)
	}
	leaseUS, err := permit.CheckLease(lease)
	if err != nil {
		return p, fmt.Errorf("redisstore: renew: %w", err)
	}
	now, err := s.clock()
	if err != nil {
		return p, err
	}
	reply, err := concRenew.Run(ctx, s.client, []string{s.ConcurrencyKey(p.Key)}, p.ID, leaseUS, now).Result()
	if err != nil {
		s.failed(err)
		return p, fmt.Errorf("redisstore: renew: %w", err)
	}
	v, err := parseInts(reply, 2)
	if err != nil || v[0] > 1 || (v[0] == 1) != (v[1] > 0) {
		return p, fmt.Errorf("redisstore: renew: unexpected reply %v", reply)
	}
	if v[0] == 0 {
		return p, fmt.Errorf("redisstore: renew: %w", tollgate.ErrPermitExpired)
	}
	p.Expires = time.UnixMicro(v[1])
	return p, nil
}

// parseInts checks a reply of n non-negative integers.
func parseInts(reply any, n int) ([]int64, error) {
	arr, ok := reply.([]any)
	if !ok || len(arr) != n {
		return nil, fmt.Errorf("want an array of %d integers", n)
	}
	v := make([]int64, n)
	for i, x := range arr {
		k, ok := x.(int64)
		if !ok || k < 0 {
			return nil, fmt.Errorf("element %d is %v, want a non-negative integer", i, x)
		}
		v[i] = k
	}
	return v, nil
}
