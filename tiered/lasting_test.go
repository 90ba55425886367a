package tiered_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// lasting returns a client of server on which every script or function
// call also gives the keys it names a TTL of an hour, in the same
// transaction (MULTI/EXEC), so that no key the call keeps can run out
// before the test ends.
//
// The tests that use it decide on a clock of their own, which stands
// still, steps back and jumps ahead, while Redis counts a key's TTL in real
// time: a TTL of a few ms, set at an instant of the test's clock where a
// state is nearly full, can run out while that clock has not moved, most
// of all on a busy machine, and Redis would then forget a state the clock
// says is live. Keeping every key longer changes no decision: a state's
// expiry is on the decision's clock (a bucket's e, a window's number, a
// log's entries), and a state found after it decides as no state, as
// redisstore's model tests prove. A key a script deleted stays deleted
// (PEXPIRE sets no TTL on a key that is not there).
func lasting(t *testing.T) *redis.Client {
	rdb := server.Client(t)
	rdb.AddHook(lastingHook{rdb})
	return rdb
}

type lastingHook struct{ rdb *redis.Client }

func (lastingHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h lastingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if scriptKeys(cmd) == nil {
			return next(ctx, cmd)
		}
		return h.keep(ctx, []redis.Cmder{cmd})
	}
}

// ProcessPipelineHook sends a pipeline that holds a script call (redisstore
// sends its decisions as pipelines) as a transaction; the transaction it
// sends, and any other, it leaves as it is.
func (h lastingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if cmds[0].Name() == "multi" || !slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return scriptKeys(c) != nil }) {
			return next(ctx, cmds)
		}
		return h.keep(ctx, cmds)
	}
}

// keep sends cmds in one transaction, each script call followed by a
// PEXPIRE of an hour of each of its keys, and returns the first error of
// cmds (a NOSCRIPT, which the caller handles, is one).
func (h lastingHook) keep(ctx context.Context, cmds []redis.Cmder) error {
	_, _ = h.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for _, c := range cmds {
			_ = p.Process(ctx, c)
			for _, k := range scriptKeys(c) {
				p.PExpire(ctx, k, time.Hour)
			}
		}
		return nil
	})
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return err
		}
	}
	return nil
}

// scriptKeys returns the keys of an EVAL, EVALSHA or FCALL (name, script
// or function, number of keys, keys...), nil for any other command.
func scriptKeys(cmd redis.Cmder) []string {
	switch cmd.Name() {
	case "eval", "evalsha", "fcall":
	default:
		return nil
	}
	args := cmd.Args()
	if len(args) < 3 {
		return nil
	}
	n, err := strconv.Atoi(fmt.Sprint(args[2]))
	if err != nil || n < 0 || len(args) < 3+n {
		return nil
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprint(args[3+i])
	}
	return keys
}
