package redisstore

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
)

// BatchCall is one decision for ExecBatch, and its outcome.
type BatchCall struct {
	Key   string
	Limit tollgate.Limit
	N     int
	Now   time.Time // the zero time: the server's
	Res   tollgate.Result
	Err   error
}

// ExecBatch sends calls as one pipeline, grouped as s (made with
// WithPipeline) groups a pipeline's decisions, and fills in their outcomes.
func ExecBatch(s *Store, calls []BatchCall) {
	b := &batch{noDeadline: true}
	for _, c := range calls {
		now := ""
		if !c.Now.IsZero() {
			now = strconv.FormatInt(c.Now.UnixMicro(), 10)
		}
		p, err := tollgate.CheckRequest(c.Key, c.Limit, c.N)
		if err != nil {
			panic(err)
		}
		b.calls = append(b.calls, call{alg: p.Algorithm, key: s.Key(c.Key, c.Limit), args: scriptArgs(p, c.N, now)})
	}
	s.pipe.exec(b)
	for i := range calls {
		calls[i].Res, _, calls[i].Err = s.result(calls[i].Limit, b.calls[i].reply, b.calls[i].err)
	}
}

// SettleAt is s.SettleN that also returns the store's time of the settle
// (µs): the Redis server's, or the WithClock value.
func SettleAt(ctx context.Context, s *Store, key string, limit tollgate.Limit, at int64, reserved, actual int) (tollgate.Result, int64, error) {
	return s.settle(ctx, key, limit, at, reserved, actual)
}

// Replay makes, at the clock now (µs), a decision of cost n (reserved 0) or
// a settle of a reservation of cost reserved made at at, by its script,
// and lengthens the key's TTL to keep in the same MULTI: a state replayed
// long after the fact lives on however long its TTL would have run in
// real time.
func Replay(ctx context.Context, s *Store, key string, limit tollgate.Limit, now int64, n int, at int64, reserved, actual int, keep time.Duration) (tollgate.Result, error) {
	clock := strconv.FormatInt(now, 10)
	rkey := s.Key(key, limit)
	var cmd *redis.Cmd
	if reserved == 0 {
		p, err := tollgate.CheckRequest(key, limit, n)
		if err != nil {
			return tollgate.Result{}, err
		}
		_, err = s.client.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			cmd = pipe.Eval(ctx, sources[p.Algorithm], []string{rkey}, scriptArgs(p, n, clock)...)
			pipe.PExpire(ctx, rkey, keep)
			return nil
		})
		if err != nil {
			return tollgate.Result{}, err
		}
	} else {
		p, d, err := tollgate.CheckSettle(key, limit, at, reserved, actual)
		if err != nil {
			return tollgate.Result{}, err
		}
		_, err = s.client.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			cmd = pipe.Eval(ctx, settleSource, []string{rkey}, settleArgs(p, at, d, clock)...)
			pipe.PExpire(ctx, rkey, keep)
			return nil
		})
		if err != nil {
			return tollgate.Result{}, err
		}
	}
	res, _, err := s.result(limit, cmd.Val(), cmd.Err())
	return res, err
}
