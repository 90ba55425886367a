package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/redisstore"
)

// BoundaryConfig sets up the boundary demo. The zero value is the lab's:
// 10 requests per 5 s window, the first 10 sent 1 s before a window edge
// and the next 10 sent 100 ms after it.
type BoundaryConfig struct {
	// Limit is how many requests each limiter admits per Window, and how
	// many the client sends on each side of the edge (default 10).
	Limit int
	// Window is the fixed window's length, and the period of every limit
	// (default 5 s). Windows are aligned to the Unix epoch in Redis time.
	Window time.Duration
	// Before is how long before the window edge the first batch is sent
	// (default 1 s); After, how long after it the second one is (default
	// 100 ms). Both batches must fit in their windows: Before + a batch's
	// few milliseconds and After are well below Window.
	Before, After time.Duration
}

func (c BoundaryConfig) withDefaults() BoundaryConfig {
	if c.Limit == 0 {
		c.Limit = 10
	}
	if c.Window == 0 {
		c.Window = 5 * time.Second
	}
	if c.Before == 0 {
		c.Before = time.Second
	}
	if c.After == 0 {
		c.After = 100 * time.Millisecond
	}
	return c
}

// BoundaryRow is what one limiter admitted on each side of the edge.
type BoundaryRow struct {
	Name          string
	Before, After int
}

// Boundary sends a batch of Limit requests shortly before a window edge and
// another right after it, to five limiters of Limit per Window each: the
// fixed window built the naive way (INCR + EXPIRE), tollgate's fixed
// window, its token bucket (burst Limit), its sliding window counter and its
// sliding window log. Both fixed windows admit twice the limit within
// Before + After — the fang at the window edge is the algorithm's, not the
// implementation's — while the others stay at the limit, or the bucket's
// burst plus what it refilled in between.
func Boundary(ctx context.Context, rdb redis.UniversalClient, w io.Writer, cfg BoundaryConfig) ([]BoundaryRow, error) {
	cfg = cfg.withDefaults()
	if cfg.Limit < 1 || cfg.Window <= 0 || cfg.Before <= 0 || cfg.After <= 0 || cfg.Before+cfg.After >= cfg.Window {
		return nil, fmt.Errorf("lab: boundary: invalid config %+v", cfg)
	}
	fmt.Fprintf(w, "# %d requests per %v window; %d requests %v before a window edge, %d more %v after it (Redis time)\n",
		cfg.Limit, cfg.Window, cfg.Limit, cfg.Before, cfg.Limit, cfg.After)
	// A batch that overran its window on a busy machine proves nothing; the
	// demo tries again at a later edge, on fresh keys, a few times.
	for attempt := 1; ; attempt++ {
		limiters := boundaryLimiters(rdb, cfg)
		rows, err := boundaryAttempt(ctx, rdb, cfg, limiters)
		var slow *slowBatchError
		if errors.As(err, &slow) && attempt < boundaryAttempts {
			fmt.Fprintf(w, "# %v; again at a later edge, on fresh keys\n", slow)
			continue
		}
		if err != nil {
			return nil, err
		}
		return rows, printBoundary(w, cfg, limiters, rows)
	}
}

// boundaryAttempts is how many edges the demo tries before it gives up on a
// machine too busy to send a batch within its window.
const boundaryAttempts = 4

// slowBatchError says a batch ended past the instant it had to end by.
type slowBatchError struct {
	which string
	late  time.Duration
}

func (e *slowBatchError) Error() string {
	return fmt.Sprintf("the %s batch ended %v too late", e.which, e.late)
}

// boundaryAttempt runs the demo once: it finds the next window edge in
// Redis time with room for the first batch before it, sends that batch, then
// the second one After the edge.
func boundaryAttempt(ctx context.Context, rdb redis.UniversalClient, cfg BoundaryConfig, limiters []boundaryLimiter) ([]BoundaryRow, error) {
	rows := make([]BoundaryRow, len(limiters))
	batch := func(after bool) error { return boundaryBatch(ctx, cfg, limiters, rows, after) }
	// Sleeping a difference of two Redis times makes the local clock's
	// offset irrelevant.
	now, err := redisTime(ctx, rdb)
	if err != nil {
		return nil, err
	}
	edge := nextEdge(now, cfg)
	if err := sleep(ctx, edge.Add(-cfg.Before).Sub(now)); err != nil {
		return nil, err
	}
	if err := batch(false); err != nil {
		return nil, err
	}
	if now, err = redisTime(ctx, rdb); err != nil {
		return nil, err
	}
	if !now.Before(edge) {
		return nil, fmt.Errorf("lab: boundary: %w", &slowBatchError{"first", now.Sub(edge)})
	}
	if err := sleep(ctx, edge.Add(cfg.After).Sub(now)); err != nil {
		return nil, err
	}
	if err := batch(true); err != nil {
		return nil, err
	}
	if now, err = redisTime(ctx, rdb); err != nil {
		return nil, err
	}
	if late := now.Sub(edge) - (cfg.Window - cfg.Before); late >= 0 {
		return nil, fmt.Errorf("lab: boundary: %w", &slowBatchError{"second", late})
	}
	return rows, nil
}

// boundaryLimiter is one limiter of the demo: its name, what its row
// shows, and its decision.
type boundaryLimiter struct {
	name, note string
	allow      func(context.Context) (bool, error)
}

// boundaryLimiters are the demo's limiters, each on a key of its own.
func boundaryLimiters(rdb redis.UniversalClient, cfg BoundaryConfig) []boundaryLimiter {
	id := freshKey("boundary")
	store := redisstore.New(rdb)
	lim := func(a tollgate.Algorithm) tollgate.Limit {
		return tollgate.Limit{Algorithm: a, Rate: cfg.Limit, Period: cfg.Window, Burst: cfg.Limit}
	}
	span := cfg.Before + cfg.After
	return []boundaryLimiter{
		{"fixed window, INCR + EXPIRE", fmt.Sprintf("2× the limit within %v: the new window counts from zero", span),
			naiveWindow{rdb: rdb, key: id + ":naive", limit: cfg.Limit, window: cfg.Window}.allow},
		{"fixed_window (tollgate)", "the same: the fang is the algorithm's, not INCR's",
			storeAllow(store, id, lim(tollgate.FixedWindow))},
		{"token_bucket, burst " + strconv.Itoa(cfg.Limit), fmt.Sprintf("the burst, then only what refilled in %v", span),
			storeAllow(store, id, lim(tollgate.TokenBucket))},
		{"sliding_window_counter", "the previous window still weighs almost all of its count",
			storeAllow(store, id, lim(tollgate.SlidingWindowCounter))},
		{"sliding_window_log", fmt.Sprintf("exact: never more than %d in any %v", cfg.Limit, cfg.Window),
			storeAllow(store, id, lim(tollgate.SlidingWindowLog))},
	}
}

// boundaryBatch sends cfg.Limit requests to each limiter and counts what
// each admitted in its row, before the edge or after it.
func boundaryBatch(ctx context.Context, cfg BoundaryConfig, limiters []boundaryLimiter, rows []BoundaryRow, after bool) error {
	for i, l := range limiters {
		rows[i].Name = l.name
		for range cfg.Limit {
			ok, err := l.allow(ctx)
			if err != nil {
				return fmt.Errorf("lab: boundary: %s: %w", l.name, err)
			}
			if ok && after {
				rows[i].After++
			} else if ok {
				rows[i].Before++
			}
		}
	}
	return nil
}

// nextEdge returns the next window edge after now with room for the first
// batch before it. Windows are aligned to the Unix epoch (time.Truncate
// would align them to year 1).
func nextEdge(now time.Time, cfg BoundaryConfig) time.Time {
	win := cfg.Window.Microseconds()
	edge := time.UnixMicro((now.UnixMicro()/win + 1) * win)
	if edge.Sub(now) < cfg.Before+100*time.Millisecond {
		edge = edge.Add(cfg.Window)
	}
	return edge
}

// printBoundary writes the demo's table.
func printBoundary(w io.Writer, cfg BoundaryConfig, limiters []boundaryLimiter, rows []BoundaryRow) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for i, r := range rows {
		fmt.Fprintf(tw, "%s\tadmitted %d of %d\t(%d before the edge + %d after)\t%s\n",
			r.Name, r.Before+r.After, 2*cfg.Limit, r.Before, r.After, limiters[i].note)
	}
	return tw.Flush()
}

// naiveWindow is the fixed window most people write first: the window's
// index from the server's clock, then INCR of the window's counter, then
// EXPIRE on it — three calls, as plain as it gets. (It also leaves a counter
// without a TTL if the client dies between INCR and EXPIRE; tollgate's
// fixed window writes both in one script.)
type naiveWindow struct {
	rdb    redis.UniversalClient
	key    string
	limit  int
	window time.Duration
}

func (n naiveWindow) allow(ctx context.Context) (bool, error) {
	now, err := redisTime(ctx, n.rdb)
	if err != nil {
		return false, err
	}
	k := n.key + ":" + strconv.FormatInt(now.UnixMicro()/n.window.Microseconds(), 10)
	count, err := n.rdb.Incr(ctx, k).Result()
	if err != nil {
		return false, err
	}
	if count == 1 {
		if err := n.rdb.Expire(ctx, k, n.window).Err(); err != nil {
			return false, err
		}
	}
	return count <= int64(n.limit), nil
}

func storeAllow(s *redisstore.Store, key string, l tollgate.Limit) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		res, err := s.AllowN(ctx, key, l, 1)
		return res.Allowed, err
	}
}

// redisTime returns the Redis server's clock.
func redisTime(ctx context.Context, rdb redis.UniversalClient) (time.Time, error) {
	t, err := rdb.Time(ctx).Result()
	if err != nil {
		return t, fmt.Errorf("lab: TIME: %w", err)
	}
	return t, nil
}
