package redisstore

import (
	"context"
	"strconv"
	"time"

	"github.com/tollgate/tollgate"
)

// BatchCall is one decision for ExecBatch, and its outcome.
type BatchCall struct {
	Key   string
	Limit tollgate.Limit
	N     int
	Now   time.Time // the zero time: the server's
	Res   tollgate.Result
	At    int64 // the time of the decision, µs, as ReserveN returns it
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
		calls[i].Res, calls[i].At, calls[i].Err = s.result(calls[i].Limit, b.calls[i].reply, b.calls[i].err)
	}
}

// SettleAt is s.SettleN that also returns the store's time of the settle
// (µs): the Redis server's, or the WithClock value.
func SettleAt(ctx context.Context, s *Store, key string, limit tollgate.Limit, at int64, reserved, actual int) (tollgate.Result, int64, error) {
	return s.settle(ctx, key, limit, at, reserved, actual)
}
