package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
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

func TestSpawnerFunc(t *testing.T) {
	t.Parallel()
	NewServer(t)
	buf := make([]byte, 1<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	if !strings.Contains(stacks, "\n"+SpawnerFunc+"()") {
		t.Errorf("no goroutine runs %s:\n%s", SpawnerFunc, stacks)
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
	killed := time.Now()
	promoted, err := c.KillMaster(ctx, c.Nodes[0])
	if err != nil {
		t.Fatal(err)
	}
	if promoted != c.Nodes[3] {
		t.Fatalf("KillMaster promoted %s, want the replica %s", promoted.Addr(), c.Nodes[3].Addr())
	}
	t.Logf("failover done %v after the kill (cluster-node-timeout %v)", time.Since(killed), ClusterNodeTimeout)
	ms, err = c.Masters(ctx)
	if err != nil || len(ms) != 3 || ms[2] != c.Nodes[3] {
		t.Fatalf("Masters() after the failover = %v, %v; want Nodes[1], Nodes[2], Nodes[3]", ms, err)
	}
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
	t.Logf("cluster client recovered after %d failed SETs, %v after the kill", failures, time.Since(killed))

	// The old master comes back empty and rejoins as a replica of the node
	// that replaced it.
	if err := c.Nodes[0].Start(); err != nil {
		t.Fatal(err)
	}
	for c.checkReplicaOf(ctx, c.Nodes[0], c.Nodes[3]) != nil {
		if ctx.Err() != nil {
			t.Fatalf("restarted old master did not become a replica: %v", c.checkReplicaOf(ctx, c.Nodes[0], c.Nodes[3]))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestClusterFailover(t *testing.T) {
	t.Parallel()
	c := NewCluster(t, 3, 1)
	ctx := ctxTimeout(t, 30*time.Second)
	cc := c.Client(t)
	if err := cc.Set(ctx, "{a}k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	slot, err := cc.ClusterKeySlot(ctx, "{a}k").Result()
	if err != nil {
		t.Fatal(err)
	}
	owner := c.Nodes[int(slot)*3/clusterSlots]

	start := time.Now()
	promoted, err := c.Failover(ctx, owner)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("manual failover of %s to %s took %v", owner.Addr(), promoted.Addr(), time.Since(start))
	if got, want := promoted, c.Nodes[3+int(slot)*3/clusterSlots]; got != want {
		t.Fatalf("Failover promoted %s, want its replica %s", got.Addr(), want.Addr())
	}
	// No write is lost in a manual failover: the promoted replica has it.
	if got, err := promoted.Client(t).Do(ctx, "READONLY").Result(); err != nil || got != "OK" {
		t.Fatalf("READONLY = %v, %v", got, err)
	}
	if got, err := cc.Get(ctx, "{a}k").Result(); err != nil || got != "v" {
		t.Fatalf("GET after the failover = %q, %v; want \"v\"", got, err)
	}
	if err := c.checkReplicaOf(ctx, owner, promoted); err != nil {
		t.Fatal(err)
	}
	// And back: the old master is a replica in sync, so it can take over.
	back, err := c.Failover(ctx, promoted)
	if err != nil {
		t.Fatal(err)
	}
	if back != owner {
		t.Fatalf("second Failover promoted %s, want %s", back.Addr(), owner.Addr())
	}
	if _, err := c.Failover(ctx, c.Nodes[3+(int(slot)*3/clusterSlots+1)%3]); err == nil {
		t.Error("Failover of a replica succeeded")
	}
}

func TestClusterMoveSlot(t *testing.T) {
	t.Parallel()
	c := NewCluster(t, 3, 0)
	ctx := ctxTimeout(t, 30*time.Second)
	cc := c.Client(t)
	const keys = 35 // several MIGRATE batches
	for i := range keys {
		if err := cc.Set(ctx, fmt.Sprintf("{m}%d", i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	slot, err := cc.ClusterKeySlot(ctx, "{m}").Result()
	if err != nil {
		t.Fatal(err)
	}
	from := c.Nodes[int(slot)*3/clusterSlots]
	to := c.Nodes[(int(slot)*3/clusterSlots+1)%3]
	if err := c.MoveSlot(ctx, int(slot), to); err != nil {
		t.Fatal(err)
	}
	if err := c.MoveSlot(ctx, int(slot), to); err != nil {
		t.Fatalf("moving a slot to its owner: %v", err)
	}
	for n, want := range map[*Server]int64{from: 0, to: keys} {
		if got, err := n.Client(t).ClusterCountKeysInSlot(ctx, int(slot)).Result(); err != nil || got != want {
			t.Errorf("COUNTKEYSINSLOT %d on %s = %d, %v; want %d", slot, n.Addr(), got, err, want)
		}
	}
	for i := range keys {
		// The client follows MOVED from the old owner.
		if got, err := cc.Get(ctx, fmt.Sprintf("{m}%d", i)).Int(); err != nil || got != i {
			t.Fatalf("GET {m}%d after the move = %d, %v", i, got, err)
		}
	}
	if c.Node(to.Addr()) != to || c.Node("127.0.0.1:1") != nil {
		t.Error("Node does not find nodes by address")
	}
}

func TestSentinel(t *testing.T) {
	t.Parallel()
	start := time.Now()
	s := NewSentinel(t, 1)
	t.Logf("%v ready in %v", s, time.Since(start))
	ctx := ctxTimeout(t, 60*time.Second)
	if got, want := len(s.SentinelAddrs()), 3; got != want {
		t.Fatalf("%d sentinels, want %d", got, want)
	}
	m, err := s.Master(ctx)
	if err != nil || m != s.Nodes[0] {
		t.Fatalf("Master() = %v, %v; want Nodes[0]", m, err)
	}
	rc := s.Client(t)
	if err := rc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// WAIT: the replica has the write before the master dies.
	if n, err := rc.Wait(ctx, 1, 5000).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v", n, err)
	}

	killed := time.Now()
	old, promoted, err := s.KillMaster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sentinels promoted %s %v after the kill (down-after %v, failover-timeout %v)",
		promoted.Addr(), time.Since(killed), SentinelDownAfter, SentinelFailoverTimeout)
	if old != s.Nodes[0] || promoted != s.Nodes[1] {
		t.Fatalf("KillMaster = %s, %s; want %s, %s", old.Addr(), promoted.Addr(), s.Nodes[0].Addr(), s.Nodes[1].Addr())
	}
	// The failover client finds the new master.
	for {
		got, err := rc.Get(ctx, "k").Result()
		if err == nil {
			if got != "v" {
				t.Fatalf("GET after failover = %q, want \"v\"", got)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("GET after failover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("failover client served again %v after the kill", time.Since(killed))

	// The old master comes back as an empty master; the sentinels make it
	// a replica of the new one.
	if err := old.Start(); err != nil {
		t.Fatal(err)
	}
	converted := time.Now()
	if err := poll(ctx, "the old master to be converted", func(ctx context.Context) error { return checkRole(ctx, old, promoted) }); err != nil {
		t.Fatal(err)
	}
	t.Logf("restarted old master converted to a replica after %v", time.Since(converted))
	if m, err := s.Master(ctx); err != nil || m != promoted {
		t.Fatalf("Master() after the old master came back = %v, %v; want %s", m, err, promoted.Addr())
	}
}

func TestStartSentinelNeedsReplica(t *testing.T) {
	t.Parallel()
	if s, err := StartSentinel(0); err == nil {
		s.Close()
		t.Fatal("StartSentinel(0) succeeded")
	}
}
