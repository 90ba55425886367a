package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestServerSetGet(t *testing.T) {
	t.Parallel()
	s := NewServer(t)
	if got, want := s.Addr(), "127.0.0.1:"+strconv.Itoa(s.Port()); got != want {
		t.Errorf("Addr() = %q, want %q", got, want)
	}
	if got, want := s.URL(), "redis://"+s.Addr(); got != want {
		t.Errorf("URL() = %q, want %q", got, want)
	}
	opt, err := redis.ParseURL(s.URL())
	if err != nil || opt.Addr != s.Addr() {
		t.Errorf("ParseURL(%q) = %v, %v", s.URL(), opt, err)
	}
	if !s.Running() {
		t.Error("Running() = false for a started server")
	}

	ctx := ctxTimeout(t, 5*time.Second)
	rc := s.Client(t)
	if err := rc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if got, err := rc.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET = %q, %v; want \"v\"", got, err)
	}
	for param, want := range map[string]string{"save": "", "appendonly": "no", "bind": "127.0.0.1"} {
		got, err := rc.ConfigGet(ctx, param).Result()
		if err != nil || got[param] != want {
			t.Errorf("CONFIG GET %s = %v, %v; want %q", param, got, err, want)
		}
	}
}

func TestServerWithArgs(t *testing.T) {
	t.Parallel()
	s := NewServer(t, WithArgs("--maxmemory", "10mb", "--maxmemory-policy", "allkeys-lru"))
	ctx := ctxTimeout(t, 5*time.Second)
	got, err := s.Client(t).ConfigGet(ctx, "maxmemory*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if got["maxmemory"] != "10485760" || got["maxmemory-policy"] != "allkeys-lru" {
		t.Errorf("CONFIG GET maxmemory* = %v", got)
	}
}

func TestServerBadArgsReportLog(t *testing.T) {
	t.Parallel()
	s, err := StartServer(WithArgs("--no-such-directive", "x"))
	if err == nil {
		s.Close()
		t.Fatal("StartServer with a bad directive succeeded")
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "redistest: start redis-server") || !strings.Contains(msg, "no-such-directive") {
		t.Errorf("error does not carry the prefix and redis's complaint:\n%s", msg)
	}
	if errors.Is(err, errAddrInUse) {
		t.Errorf("bad directive classified as address in use: %v", err)
	}
}

func TestServerStopStart(t *testing.T) {
	t.Parallel()
	s := NewServer(t)
	rc := s.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	if err := rc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	addr := s.Addr()

	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if s.Running() {
		t.Error("Running() = true after Stop")
	}
	if err := s.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if err := rc.Get(ctx, "k").Err(); err == nil || errors.Is(err, redis.Nil) {
		t.Fatalf("GET on a stopped server: err = %v, want a connection error", err)
	}
	if err := s.Pause(); err == nil {
		t.Error("Pause on a stopped server succeeded")
	}

	if err := s.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if s.Addr() != addr || !s.Running() {
		t.Fatalf("after Start: Addr() = %s (was %s), Running() = %v", s.Addr(), addr, s.Running())
	}
	if err := s.Start(); err == nil {
		t.Error("Start on a running server succeeded")
	}
	// The same client reconnects; the data is gone.
	if err := rc.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET after restart: err = %v, want redis.Nil", err)
	}
	if n, err := rc.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("DBSIZE after restart = %d, %v; want 0", n, err)
	}
	if err := rc.Set(ctx, "k2", "v2", 0).Err(); err != nil {
		t.Fatalf("SET after restart: %v", err)
	}
}

func TestServerStartWaitsForPort(t *testing.T) {
	t.Parallel()
	s := NewServer(t)
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	// Someone grabs the port while the server is down and lets go later.
	l, err := net.Listen("tcp", s.Addr())
	if err != nil {
		t.Fatalf("listen on the stopped server's port: %v", err)
	}
	time.AfterFunc(500*time.Millisecond, func() { l.Close() })
	start := time.Now()
	if err := s.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if time.Since(start) < 400*time.Millisecond {
		t.Errorf("Start returned after %v, before the port was free", time.Since(start))
	}
	if err := s.Client(t).Ping(ctxTimeout(t, 5*time.Second)).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestStartServerRetriesTakenPort is not parallel: it swaps pickFreePort.
func TestStartServerRetriesTakenPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port
	calls := 0
	pickFreePort = func() (int, error) {
		calls++
		if calls == 1 {
			return taken, nil // lose the race: somebody bound it meanwhile
		}
		return freePort()
	}
	defer func() { pickFreePort = freePort }()

	s, err := StartServer()
	if err != nil {
		t.Fatalf("StartServer: %v", err)
	}
	defer s.Close()
	if s.Port() == taken || calls < 2 {
		t.Fatalf("port %d (taken %d) after %d picks", s.Port(), taken, calls)
	}
	if err := s.Client(t).Ping(ctxTimeout(t, 5*time.Second)).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestServerPauseResume(t *testing.T) {
	t.Parallel()
	s := NewServer(t)
	rc := s.Client(t)
	if err := rc.Ping(ctxTimeout(t, 5*time.Second)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if !s.Running() {
		t.Error("Running() = false for a paused server")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	start := time.Now()
	err := rc.Get(ctx, "k").Err()
	elapsed := time.Since(start)
	cancel()
	if err == nil || errors.Is(err, redis.Nil) {
		t.Fatalf("GET on a paused server: err = %v, want a timeout", err)
	}
	if elapsed > time.Second {
		t.Fatalf("GET on a paused server took %v despite a 100ms context", elapsed)
	}

	if err := s.Resume(); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if err := rc.Set(ctxTimeout(t, 5*time.Second), "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET after Resume: %v", err)
	}
}

func TestServerClose(t *testing.T) {
	t.Parallel()
	s, err := StartServer()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(); err != nil { // Close must also kill a stopped process
		t.Fatal(err)
	}
	pid := s.cmd.Process.Pid
	s.Close()
	s.Close()
	if alive(pid) {
		t.Errorf("redis-server pid %d alive after Close", pid)
	}
	if _, err := os.Stat(s.dir); !os.IsNotExist(err) {
		t.Errorf("temp dir %s still there after Close: %v", s.dir, err)
	}
	if s.Running() {
		t.Error("Running() = true after Close")
	}
	if err := s.Start(); err == nil {
		t.Error("Start after Close succeeded")
	}
	if c, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		c.Close()
		t.Errorf("%s still accepts connections after Close", s.Addr())
	}
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// "pid (comm) state ..."
	_, rest, _ := strings.Cut(string(stat), ") ")
	return !strings.HasPrefix(rest, "Z") && !strings.HasPrefix(rest, "X")
}

// TestHelperProcess is not a real test: TestServerDiesWithTestBinary runs the
// test binary with it to get a process that starts redis-server and is then
// killed without calling Close.
func TestHelperProcess(t *testing.T) {
	if os.Getenv("REDISTEST_HELPER") != "1" {
		return
	}
	s, err := StartServer()
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	fmt.Printf("PID %d %s\n", s.cmd.Process.Pid, s.dir)
	time.Sleep(time.Minute)
	os.Exit(2)
}

func TestServerDiesWithTestBinary(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "REDISTEST_HELPER=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("reading helper output: %v", err)
	}
	var pid int
	var dir string
	if _, err := fmt.Sscanf(line, "PID %d %s", &pid, &dir); err != nil {
		t.Fatalf("helper said %q", line)
	}
	defer os.RemoveAll(dir) // the helper cannot clean up after itself
	if !alive(pid) {
		t.Fatalf("redis-server pid %d not running while the helper is", pid)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("redis-server pid %d outlived its killed parent", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := NewCluster(t, 3, 0)
	t.Logf("%v formed in %v", c, time.Since(start))
	ctx := ctxTimeout(t, 20*time.Second)

	if len(c.Nodes) != 3 || len(c.Addrs()) != 3 {
		t.Fatalf("%d nodes, %d addrs; want 3", len(c.Nodes), len(c.Addrs()))
	}
	for _, n := range c.Nodes {
		info, err := n.Client(t).ClusterInfo(ctx).Result()
		if err != nil {
			t.Fatalf("CLUSTER INFO on %s: %v", n.Addr(), err)
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_assigned:16384") {
			t.Errorf("CLUSTER INFO on %s:\n%s", n.Addr(), info)
		}
	}

	cc := c.Client(t)
	const keys = 1000
	slots := map[int64]bool{}
	for i := range keys {
		k := fmt.Sprintf("key:%d", i)
		if err := cc.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
		slot, err := cc.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		slots[slot] = true
	}
	if len(slots) < 900 {
		t.Errorf("keys landed in only %d slots", len(slots))
	}
	for i := range keys {
		k := fmt.Sprintf("key:%d", i)
		if got, err := cc.Get(ctx, k).Int(); err != nil || got != i {
			t.Fatalf("GET %s = %d, %v; want %d", k, got, err, i)
		}
	}
	total := int64(0)
	for _, n := range c.Nodes {
		size, err := n.Client(t).DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if size == 0 {
			t.Errorf("master %s holds no keys", n.Addr())
		}
		total += size
	}
	if total != keys {
		t.Errorf("masters hold %d keys in total, want %d", total, keys)
	}
	ms, err := c.Masters(ctx)
	if err != nil || len(ms) != 3 {
		t.Errorf("Masters() = %d nodes, %v; want 3", len(ms), err)
	}
}

func TestClusterWithReplicas(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := NewCluster(t, 3, 1)
	t.Logf("%v formed in %v", c, time.Since(start))
	ctx := ctxTimeout(t, 20*time.Second)

	if len(c.Nodes) != 6 {
		t.Fatalf("%d nodes, want 6", len(c.Nodes))
	}
	roles := map[string]int{}
	for i, n := range c.Nodes {
		role, err := n.Client(t).Do(ctx, "ROLE").Slice()
		if err != nil || len(role) == 0 {
			t.Fatalf("ROLE on %s: %v, %v", n.Addr(), role, err)
		}
		roles[fmt.Sprint(role[0])]++
		if i >= 3 { // ROLE of a replica: slave, master ip, master port, state, offset
			if len(role) < 4 || fmt.Sprint(role[2]) != strconv.Itoa(c.Nodes[i-3].Port()) || role[3] != "connected" {
				t.Errorf("ROLE on replica %s = %v, want replica of %s, connected", n.Addr(), role, c.Nodes[i-3].Addr())
			}
		}
	}
	if roles["master"] != 3 || roles["slave"] != 3 {
		t.Fatalf("roles = %v, want 3 masters and 3 slaves", roles)
	}
	ms, err := c.Masters(ctx)
	if err != nil || len(ms) != 3 || ms[0] != c.Nodes[0] || ms[2] != c.Nodes[2] {
		t.Fatalf("Masters() = %v, %v; want the first three nodes", ms, err)
	}

	// A crashed master is replaced by its replica, and the cluster client
	// follows. This is what failover tests of the rate limiter rely on.
	cc := c.Client(t)
	if err := c.Nodes[0].Stop(); err != nil {
		t.Fatal(err)
	}
	for {
		ms, err := c.Masters(ctx)
		if err != nil {
			t.Fatalf("no failover to %s: %v", c.Nodes[3].Addr(), err)
		}
		if len(ms) == 3 && ms[len(ms)-1] == c.Nodes[3] {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("failover done %v after start", time.Since(start))
	// The client learns the new slot map lazily; a few errors are expected
	// (and are what rate-limiter failover tests are about).
	failures := 0
	for i := range 100 {
		k := fmt.Sprintf("after-failover:%d", i)
		for {
			err := cc.Set(ctx, k, i, 0).Err()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("SET %s after failover: %v", k, err)
			}
			failures++
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Logf("cluster client recovered after %d failed SETs, %v after start", failures, time.Since(start))
}
