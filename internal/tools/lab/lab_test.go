package lab_test

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/tools/lab"
	"github.com/tollgate/tollgate/redisstore"
)

// workerEnv makes a re-executed copy of the test binary a race worker: its
// value is the worker's arguments, separated by spaces.
const workerEnv = "TOLLGATE_LAB_RACE_WORKER"

// One real redis-server serves every test; each demo uses fresh keys.
var server *redistest.Server

func TestMain(m *testing.M) {
	if args := os.Getenv(workerEnv); args != "" {
		if err := lab.RaceWorker(context.Background(), strings.Fields(args), os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	var err error
	if server, err = redistest.StartServer(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	server.Close()
	os.Exit(code)
}

func TestBucket(t *testing.T) {
	t.Parallel()
	rdb := server.Client(t)
	var out bytes.Buffer
	if err := lab.Bucket(context.Background(), rdb, &out); err != nil {
		t.Fatal(err)
	}
	sum := sha1.Sum([]byte(redisstore.Source(tollgate.TokenBucket)))
	sha := hex.EncodeToString(sum[:])
	if got, want := strings.Split(out.String(), "\n")[1], "sha="+sha; got != want {
		t.Errorf("second line = %q, want %q\n%s", got, want, out.String())
	}
	exists, err := rdb.ScriptExists(context.Background(), sha).Result()
	if err != nil || !exists[0] {
		t.Errorf("SCRIPT EXISTS %s = %v, %v; want the script loaded", sha, exists, err)
	}
	// The EVALSHA line it prints must work as printed.
	res, err := rdb.EvalSha(context.Background(), sha, []string{"lab-test:" + t.Name()}, 1, 500000, 5, 1, "", 5).Int64Slice()
	if err != nil || len(res) != 6 || res[0] != 1 || res[1] != 4 {
		t.Errorf("EVALSHA as printed = %v, %v; want allowed 1, remaining 4", res, err)
	}
	if !strings.Contains(out.String(), "EVALSHA "+sha+" 1 mybucket 1 500000 5 1 '' 5") {
		t.Errorf("output does not show the EVALSHA call:\n%s", out.String())
	}
}

func TestDrain(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := lab.Drain(context.Background(), server.Client(t), &out); err != nil {
		t.Fatal(err)
	}
	want := `# token bucket 2/s, capacity 5, fresh key: 10 quick calls
allowed=1 remaining=4
allowed=1 remaining=3
allowed=1 remaining=2
allowed=1 remaining=1
allowed=1 remaining=0
allowed=0 remaining=0 retry_after=500ms
allowed=0 remaining=0 retry_after=500ms
allowed=0 remaining=0 retry_after=500ms
allowed=0 remaining=0 retry_after=500ms
allowed=0 remaining=0 retry_after=500ms
`
	if got := out.String(); got != want {
		t.Errorf("drain printed:\n%s\nwant:\n%s", got, want)
	}
}

func TestRefill(t *testing.T) {
	t.Parallel()
	// Only a bucket that refilled to its cap prints the same lines on every
	// run (that is what make refill shows). After a shorter wait the tokens
	// also count the time the calls themselves took — on a busy machine a
	// fraction of a token more — so those cases check the counts' bounds.
	tests := []struct {
		wait   time.Duration
		tokens int // at least; exactly when capped
		capped bool
	}{
		{time.Second, 2, false},             // 2/s × 1 s
		{lab.DefaultRefillWait, 5, true},    // 2/s × 3 s = 6, capped at 5: what make refill shows
		{1500 * time.Millisecond, 3, false}, // 2/s × 1.5 s
	}
	for _, tc := range tests {
		t.Run(tc.wait.String(), func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			if err := lab.Refill(context.Background(), server.Client(t), &out, tc.wait); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
			var tokens int
			if len(lines) < 4 {
				t.Fatalf("refill printed:\n%s", out.String())
			}
			if _, err := fmt.Sscanf(lines[3], "tokens=%d", &tokens); err != nil {
				t.Fatalf("line 4 = %q, want tokens=N", lines[3])
			}
			if tokens < tc.tokens || tokens > 5 || (tc.capped && tokens != tc.tokens) {
				t.Fatalf("tokens=%d after %v, want %d", tokens, tc.wait, tc.tokens)
			}
			var want strings.Builder
			fmt.Fprintf(&want, "# token bucket 2/s, capacity 5, fresh key: drain it, wait %v, look, then spend what is there and one more\n", tc.wait)
			fmt.Fprintf(&want, "drain: 5 allowed, 5 denied\nwait %v\ntokens=%d\n", tc.wait, tokens)
			for i := tokens - 1; i >= 0; i-- {
				fmt.Fprintf(&want, "allowed=1 remaining=%d\n", i)
			}
			got := out.String()
			if tc.capped {
				want.WriteString("allowed=0 remaining=0 retry_after=500ms\n")
			} else {
				// The fraction of a token left decides the last retry-after.
				last := lines[len(lines)-1]
				if !strings.HasPrefix(last, "allowed=0 remaining=0 retry_after=") {
					t.Errorf("last line %q, want a denial", last)
				}
				got = strings.TrimSuffix(got, last+"\n")
			}
			if got != want.String() {
				t.Errorf("refill printed:\n%s\nwant:\n%s", out.String(), want.String())
			}
		})
	}
}

func TestSkew(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := lab.Skew(context.Background(), server.Client(t), &out); err != nil {
		t.Fatal(err)
	}
	want := `# token bucket 2/s, capacity 5, fresh key; T is the Redis server's time
now=T        4 calls allowed, tokens=1
now=T-3600s  allowed=1 remaining=0   (an hour back refills nothing; the bucket keeps its time T)
now=T-3600s  allowed=0 remaining=0 retry_after=1h0m0.5s   (from then: wait for T, then for a token)
now=T        tokens=0   (not rewarded: a bucket that had stored T-3600s would count an hour of refill, tokens=5)
`
	if got := out.String(); got != want {
		t.Errorf("skew printed:\n%s\nwant:\n%s", got, want)
	}
}

func TestBoundary(t *testing.T) {
	t.Parallel()
	// A 1 s window keeps the test short; the demo's is 5 s.
	cfg := lab.BoundaryConfig{Limit: 10, Window: time.Second, Before: 300 * time.Millisecond, After: 50 * time.Millisecond}
	var out bytes.Buffer
	rows, err := lab.Boundary(context.Background(), server.Client(t), &out, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())
	if len(rows) != 5 {
		t.Fatalf("%d rows, want 5", len(rows))
	}
	for _, r := range rows {
		if r.Before != cfg.Limit {
			t.Errorf("%s admitted %d before the edge, want all %d", r.Name, r.Before, cfg.Limit)
		}
	}
	// Both fixed windows: the whole second batch too, 2× the limit.
	for _, r := range rows[:2] {
		if r.After != cfg.Limit {
			t.Errorf("%s admitted %d after the edge, want %d (a fresh window)", r.Name, r.After, cfg.Limit)
		}
	}
	// The token bucket: only what refilled, at 10/s over ~350 ms.
	if tb := rows[2]; tb.After < 1 || tb.After >= cfg.Limit/2 {
		t.Errorf("%s admitted %d after the edge, want the few tokens refilled in 350ms", tb.Name, tb.After)
	}
	// The sliding window counter: x ms into the window the previous one
	// weighs 1 - x/1000, so it admits about one request per 100 ms (the
	// batch starts 50 ms in, later on a busy machine).
	if swc := rows[3]; swc.After >= cfg.Limit/2 {
		t.Errorf("%s admitted %d after the edge, want the few that the sliding weight allows", swc.Name, swc.After)
	}
	// The sliding window log: exact.
	if swl := rows[4]; swl.After != 0 {
		t.Errorf("%s admitted %d after the edge, want 0", swl.Name, swl.After)
	}
	if !strings.Contains(out.String(), "fixed window, INCR + EXPIRE  admitted 20 of 20") {
		t.Errorf("output does not show the fixed window's 20:\n%s", out.String())
	}
}

func TestBoundaryTriesAgainWhenLate(t *testing.T) {
	t.Parallel()
	// No batch of 10 round trips fits in a microsecond: every attempt is
	// late, and the demo says so before it gives up.
	var out bytes.Buffer
	_, err := lab.Boundary(context.Background(), server.Client(t), &out,
		lab.BoundaryConfig{Window: 200 * time.Millisecond, Before: time.Microsecond, After: time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "first batch ended") {
		t.Fatalf("err = %v, want the first batch late", err)
	}
	if got, want := strings.Count(out.String(), "again at a later edge"), 3; got != want {
		t.Errorf("%d retries printed, want %d:\n%s", got, want, out.String())
	}
}

func TestBoundaryRejectsBadConfig(t *testing.T) {
	t.Parallel()
	_, err := lab.Boundary(context.Background(), server.Client(t), &bytes.Buffer{},
		lab.BoundaryConfig{Window: time.Second, Before: 800 * time.Millisecond, After: 300 * time.Millisecond})
	if err == nil {
		t.Error("Before + After longer than the window: no error")
	}
}

func TestRace(t *testing.T) {
	t.Parallel()
	spawn := func(ctx context.Context, args []string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), workerEnv+"="+strings.Join(args, " "))
		return cmd
	}
	var out bytes.Buffer
	runs, err := lab.Race(context.Background(), server.Client(t), &out,
		lab.RaceConfig{URL: server.URL(), Spawn: spawn, Goroutines: 8, Requests: 300})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())
	naive, lua := runs[0], runs[1]
	// The naive bucket lets dozens through, so both processes get some;
	// the Lua one has only a dozen tokens to give, which one process may
	// win alone when the other wakes a millisecond later on a busy machine.
	if naive.PerProcess[0] == 0 || naive.PerProcess[1] == 0 {
		t.Errorf("%s: a process admitted nothing (%v): did both take part?", naive.Mode, naive.PerProcess)
	}
	// Race itself checks the script's count to the unit; here, the result.
	if lua.Admitted != lua.Bound {
		t.Errorf("lua admitted %d, bound %d: want exactly the bound", lua.Admitted, lua.Bound)
	}
	if naive.Admitted <= naive.Bound {
		t.Errorf("naive admitted %d, bound %d: want more than the bound (lost updates)", naive.Admitted, naive.Bound)
	}
}

func TestRaceRejectsBadConfig(t *testing.T) {
	t.Parallel()
	spawn := func(ctx context.Context, args []string) *exec.Cmd { return exec.CommandContext(ctx, "false") }
	for _, cfg := range []lab.RaceConfig{
		{},                  // no URL, no Spawn
		{URL: server.URL()}, // no Spawn
		{Spawn: spawn},      // no URL
		{URL: server.URL(), Spawn: spawn, Requests: -1},
	} {
		if _, err := lab.Race(context.Background(), server.Client(t), &bytes.Buffer{}, cfg); err == nil {
			t.Errorf("Race(%+v): no error", cfg)
		}
	}
}

func TestRaceWorkerBadArguments(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		nil,
		{"fast", server.URL(), "k", "1", "1"},
		{"lua", server.URL(), "k", "0", "1"},
		{"lua", server.URL(), "k", "x", "1"},
		{"lua", "nope://", "k", "1", "1"},
	} {
		if err := lab.RaceWorker(context.Background(), args, &bytes.Buffer{}); err == nil {
			t.Errorf("RaceWorker(%q): no error", args)
		}
	}
}

func TestConnect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("answers", func(t *testing.T) {
		t.Parallel()
		var log bytes.Buffer
		r, err := lab.Connect(ctx, server.URL(), &log)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if r.Throwaway || r.URL != server.URL() {
			t.Errorf("Connect(%s) = %+v, want that server", server.URL(), r)
		}
		if !strings.Contains(log.String(), "using the Redis at "+server.URL()) {
			t.Errorf("log = %q", log.String())
		}
	})

	t.Run("nothing answers", func(t *testing.T) {
		t.Parallel()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		url := "redis://" + l.Addr().String()
		_ = l.Close() // a port where nothing listens
		var log bytes.Buffer
		r, err := lab.Connect(ctx, url, &log)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Throwaway || r.URL == url {
			t.Errorf("Connect(%s) = %+v, want a throwaway server", url, r)
		}
		if err := r.Client.Ping(ctx).Err(); err != nil {
			t.Errorf("PING the throwaway server: %v", err)
		}
		if !strings.Contains(log.String(), "started a throwaway redis-server") {
			t.Errorf("log = %q, want it to say a server was started", log.String())
		}
		addr := strings.TrimPrefix(r.URL, "redis://")
		r.Close()
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			_ = c.Close()
			t.Errorf("the throwaway server at %s still answers after Close", addr)
		}
	})

	t.Run("answers with an error", func(t *testing.T) {
		t.Parallel()
		// The server has 16 databases: SELECT 99 fails. That is a Redis
		// that answered, so no throwaway server may stand in for it.
		url := server.URL() + "/99"
		r, err := lab.Connect(ctx, url, &bytes.Buffer{})
		if err == nil {
			r.Close()
			t.Fatalf("Connect(%s) succeeded (throwaway %v), want the SELECT error", url, r.Throwaway)
		}
		if !strings.Contains(err.Error(), "DB index is out of range") {
			t.Errorf("error %v, want the server's answer", err)
		}
	})

	t.Run("bad URL", func(t *testing.T) {
		t.Parallel()
		if r, err := lab.Connect(ctx, "http://example.com", &bytes.Buffer{}); err == nil {
			r.Close()
			t.Error("Connect(http://…): no error")
		}
	})
}
