package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/internal/test/model"
	"github.com/tollgate/tollgate/redisstore"
)

// TestBatchModel sends random decisions of every algorithm in batches of 1
// to 12 — one script call deciding several, often on one key — and
// requires every reply to be the reference model's for the same decisions
// made one after another. On the Cluster the keys fall in two slots, so a
// batch splits into a script call a slot.
//
// Redis expires keys in real time while the decisions' clock jumps: a
// batch ends before a decision the model makes after a key's expiry (the
// key is then deleted), and with a decision that leaves its key a TTL
// under half a second, which a busy machine could see run out in real time
// before the batch's next decision; after each batch the test lengthens
// the TTL of every key, and one that vanished meanwhile is forgotten by the
// model too. The TTLs themselves are the model tests' business.
func TestBatchModel(t *testing.T) {
	t.Parallel()
	for _, topo := range []struct {
		name   string
		client func(*testing.T) redis.UniversalClient
		load   bool // call the function library
	}{
		{"standalone", standalone, false},
		{"cluster", clustered, false},
		{"standalone functions", standalone, true},
		{"cluster functions", clustered, true},
	} {
		for _, alg := range tollgate.Algorithms() {
			t.Run(topo.name+"/"+alg.String(), func(t *testing.T) {
				t.Parallel()
				batchModel(t, topo.client(t), topo.load, alg, 1000)
			})
		}
	}
}

func batchModel(t *testing.T, rdb redis.UniversalClient, load bool, alg tollgate.Algorithm, steps int) {
	ctx := context.Background()
	s := redisstore.New(rdb, redisstore.WithPipeline(time.Millisecond, 64))
	if load {
		if err := s.Load(ctx); err != nil {
			t.Fatal(err)
		}
	}
	m := model.New()
	gen := conformance.NewGen(alg, rand.NewPCG(11, uint64(alg)))
	rng := rand.New(rand.NewPCG(12, uint64(alg)))
	base := fmt.Sprintf("batch:%d:", rand.Int64())
	// Keys 0 and 2 share a hash tag (the tag ends at the first '}'), key 1
	// has another.
	keyName := func(k int) string { return fmt.Sprintf("%s%d}%d", base, k%2, k) }
	type state struct {
		key   string
		limit tollgate.Limit
	}
	seen := map[string]state{} // Redis key → what it holds
	var calls []redisstore.BatchCall
	var want []tollgate.Result
	flush := func() {
		if len(calls) == 0 {
			return
		}
		redisstore.ExecBatch(s, calls)
		for i, c := range calls {
			if c.Err != nil {
				t.Fatalf("call %d of a batch of %d (%v, n %d): %v", i, len(calls), c.Limit, c.N, c.Err)
			}
			if c.Res != want[i] {
				t.Fatalf("call %d of a batch of %d (%v, n %d, at %v): got %+v, want the model's %+v", i, len(calls), c.Limit, c.N, c.Now, c.Res, want[i])
			}
		}
		calls, want = calls[:0], want[:0]
		for name, st := range seen {
			var ttl *redis.DurationCmd
			if _, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
				ttl = p.PTTL(ctx, name)
				p.PExpire(ctx, name, keep)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if ttl.Val() == -2 { // gone in real time: the model forgets it too
				m.Reset(st.key, st.limit)
				delete(seen, name)
			}
		}
	}
	size, batches := 1+rng.IntN(12), 0
	for step := 0; step < steps; step++ {
		c := gen.Next()
		key := keyName(c.Key)
		if _, err := tollgate.CheckRequest(key, c.Limit, c.N); err != nil {
			continue // the store refuses it before Redis: not this test's
		}
		name := s.Key(key, c.Limit)
		if exp, ok := m.Expiry(key, c.Limit); ok && c.Now >= exp {
			flush()
			if err := rdb.Del(ctx, name).Err(); err != nil {
				t.Fatal(err)
			}
		}
		r, err := m.AllowN(key, c.Limit, c.N, c.Now)
		if err != nil {
			t.Fatal(err)
		}
		gen.Saw(r)
		seen[name] = state{key, c.Limit}
		calls = append(calls, redisstore.BatchCall{Key: key, Limit: c.Limit, N: c.N, Now: time.UnixMicro(c.Now)})
		want = append(want, r)
		if exp, ok := m.Expiry(key, c.Limit); len(calls) >= size || ok && exp-c.Now < 500_000 {
			if len(calls) > 1 {
				batches++
			}
			flush()
			size = 1 + rng.IntN(12)
		}
	}
	flush()
	t.Logf("%d batches of several decisions in %d steps", batches, steps)
	// The limits Gen draws often have periods of microseconds, whose
	// decisions end a batch: enough must remain to test batches.
	if batches < steps/50 {
		t.Errorf("%d batches of several decisions in %d steps, want at least %d", batches, steps, steps/50)
	}
}

// TestBatchErrors: in one script call, a decision on a key tollgate did not
// write gets its own error, and the decisions around it their replies, in
// order, the last one seeing the first one's write.
func TestBatchErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := server.Client(t)
	var pipelines, cmds atomic.Int64
	rdb.AddHook(pipeHook{pipelines: &pipelines, cmds: &cmds})
	s := redisstore.New(rdb, redisstore.WithPipeline(time.Millisecond, 64))
	if err := s.Load(ctx); err != nil { // no NOSCRIPT fallback in the count
		t.Fatal(err)
	}
	limit := tollgate.Limit{Rate: 1, Period: time.Hour, Burst: 5}
	good, bad, wrong, other := key(t), key(t), key(t), key(t)
	if err := rdb.HSet(ctx, s.Key(bad, limit), "t", "x", "ts", "1", "u", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, s.Key(wrong, limit), "a string", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	calls := []redisstore.BatchCall{
		{Key: good, Limit: limit, N: 2},
		{Key: bad, Limit: limit, N: 1},
		{Key: wrong, Limit: limit, N: 1},
		{Key: other, Limit: limit, N: 1},
		{Key: good, Limit: limit, N: 1},
	}
	redisstore.ExecBatch(s, calls)
	for i, tc := range []struct {
		remaining int
		err       string
	}{{3, ""}, {0, "unexpected state"}, {0, "WRONGTYPE"}, {4, ""}, {2, ""}} {
		c := calls[i]
		switch {
		case tc.err != "" && (c.Err == nil || !strings.Contains(c.Err.Error(), tc.err)):
			t.Errorf("call %d: err = %v, want one saying %q", i, c.Err, tc.err)
		case tc.err == "" && c.Err != nil:
			t.Errorf("call %d: err = %v", i, c.Err)
		case tc.err == "" && (!c.Res.Allowed || c.Res.Remaining != tc.remaining):
			t.Errorf("call %d: got %+v, want allowed with %d remaining", i, c.Res, tc.remaining)
		}
		if c.Err != nil && strings.Contains(c.Err.Error(), c.Key) {
			t.Errorf("call %d: error %q names the key; keys are client data and errors are logged", i, c.Err)
		}
	}
	if got, want := cmds.Load(), int64(1); got != want {
		t.Errorf("%d script calls for a batch of one algorithm on one server, want %d", got, want)
	}
}

// TestBatchServerTime: a batch on the server's clock reads it once, so its
// decisions are made at one instant.
func TestBatchServerTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := server.Client(t)
	s := redisstore.New(rdb, redisstore.WithPipeline(time.Millisecond, 64))
	limit := tollgate.Limit{Rate: 1, Period: time.Hour, Burst: 3}
	keys := []string{key(t), key(t), key(t)}
	var calls []redisstore.BatchCall
	for _, k := range keys {
		calls = append(calls, redisstore.BatchCall{Key: k, Limit: limit, N: 1}, redisstore.BatchCall{Key: k, Limit: limit, N: 2})
	}
	redisstore.ExecBatch(s, calls)
	var stamps []string
	for i, c := range calls {
		if c.Err != nil || !c.Res.Allowed || c.Res.Remaining != 2-2*(i%2) {
			t.Errorf("call %d: %+v, %v", i, c.Res, c.Err)
		}
	}
	for _, k := range keys {
		ts, err := bucketField(ctx, rdb, s.Key(k, limit), "ts")
		if err != nil {
			t.Fatal(err)
		}
		stamps = append(stamps, ts)
	}
	if stamps[0] != stamps[1] || stamps[1] != stamps[2] {
		t.Errorf("stored times %v, want one instant", stamps)
	}
}

// TestBatchGroups counts the script calls of one pipeline of decisions:
// one an algorithm on a single server, one a decision on a Cluster and
// without batching; and after SCRIPT FLUSH the
// batches fall back to EVAL with the same replies. (Not parallel: it
// flushes the scripts of servers other tests count commands on.)
func TestBatchGroups(t *testing.T) {
	for _, tc := range []struct {
		name    string
		client  func(*testing.T) redis.UniversalClient
		batched bool
		want    int64
	}{
		{"standalone", standalone, true, 2},
		{"cluster", clustered, true, 12}, // a decision each: see WithBatching
		{"unbatched", standalone, false, 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := tc.client(t)
			var pipelines, cmds atomic.Int64
			rdb.AddHook(pipeHook{pipelines: &pipelines, cmds: &cmds})
			s := redisstore.New(rdb, redisstore.WithPipeline(time.Millisecond, 64), redisstore.WithBatching(tc.batched))
			for _, a := range []tollgate.Algorithm{tollgate.TokenBucket, tollgate.FixedWindow} { // no NOSCRIPT in the first count
				if err := rdb.ScriptLoad(context.Background(), redisstore.Source(a)).Err(); err != nil {
					t.Fatal(err)
				}
			}
			// Two hash tags, two algorithms, three keys in each of the four
			// pairs.
			tags := []string{key(t), key(t)}
			var calls []redisstore.BatchCall
			for i := range 12 {
				alg := []tollgate.Algorithm{tollgate.TokenBucket, tollgate.FixedWindow}[i%2]
				calls = append(calls, redisstore.BatchCall{
					Key:   fmt.Sprintf("%s}%d", tags[i/2%2], i),
					Limit: tollgate.Limit{Algorithm: alg, Rate: 10, Period: time.Minute, Burst: 10},
					N:     1,
				})
			}
			for _, flush := range []bool{false, true} {
				if flush {
					if err := rdb.ScriptFlush(context.Background()).Err(); err != nil {
						t.Fatal(err)
					}
				}
				cmds.Store(0)
				redisstore.ExecBatch(s, calls)
				for i, c := range calls {
					if want := 9 - btoi(flush); c.Err != nil || !c.Res.Allowed || int64(c.Res.Remaining) != want {
						t.Errorf("flush %v, call %d: %+v, %v; want allowed with %d remaining", flush, i, c.Res, c.Err, want)
					}
				}
				if got, want := cmds.Load(), tc.want*(1+btoi(flush)); got != want {
					t.Errorf("flush %v: %d script calls, want %d", flush, got, want)
				}
			}
		})
	}
}

func btoi(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
