package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// defaultBinary is where Debian and Ubuntu install redis-server.
	defaultBinary = "/usr/bin/redis-server"
	// loopback is the only address servers listen on and clients dial.
	loopback = "127.0.0.1"

	readyTimeout     = 10 * time.Second       // max wait for a new process to answer PING
	probeTimeout     = 250 * time.Millisecond // dial and reply timeout of one readiness probe
	pollInterval     = 20 * time.Millisecond
	startAttempts    = 5               // fresh ports tried when the chosen one was taken
	rebindTimeout    = 5 * time.Second // how long Start retries the old port
	logFileName      = "redis.log"
	stdoutFileName   = "redis.stdout"
	nodesFileName    = "nodes.conf"
	sentinelFileName = "sentinel.conf"
)

// SpawnerFunc is the function of the one goroutine the package keeps for the
// life of a test binary once it has started a process (on Linux, every
// redis-server is forked from one locked thread; see proc_linux.go).
// Goroutine leak checks ignore it, e.g.
// goleak.VerifyTestMain(m, goleak.IgnoreTopFunction(redistest.SpawnerFunc)).
const SpawnerFunc = "github.com/tollgate/tollgate/internal/test/redistest.spawner"

// errAddrInUse marks a start that failed because a port was taken between
// choosing it and redis-server binding it.
var errAddrInUse = errors.New("address already in use")

// Option configures a Server started by StartServer or NewServer.
type Option func(*config)

type config struct {
	args     []string
	cluster  bool
	sentinel string // the sentinel config file's initial content; "" for a data server
}

// WithArgs appends extra redis-server command-line configuration, for
// example WithArgs("--maxmemory", "10mb", "--maxmemory-policy", "allkeys-lru").
// They come after the package's own arguments, so they override them.
func WithArgs(extra ...string) Option {
	return func(c *config) { c.args = append(c.args, extra...) }
}

// withCluster makes the server a cluster-enabled node with its own bus port.
func withCluster() Option {
	return func(c *config) { c.cluster = true }
}

// withSentinel makes the server a Redis Sentinel (redis-server --sentinel)
// whose config file starts as conf. Sentinel rewrites that file as it learns
// the deployment, and needs it writable.
func withSentinel(conf string) Option {
	return func(c *config) { c.sentinel = conf }
}

// Server is one redis-server process on 127.0.0.1. Its port and directory are
// fixed when it is created and survive Stop and Start; Close releases them.
type Server struct {
	// Immutable after StartServer returns.
	bin     string
	cfg     config
	dir     string
	port    int
	busPort int // cluster bus port; 0 for a standalone server

	mu     sync.Mutex // guards the fields below and serializes state changes
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has been waited for
	logPos [2]int64      // sizes of the log files when cmd started
	paused bool
	closed bool
}

// StartServer starts a redis-server on a free loopback port and waits until it
// answers PING. It is meant for TestMain, where no testing.TB exists; the
// caller must call Close. Tests should use NewServer.
func StartServer(opts ...Option) (*Server, error) {
	bin, err := findBinary()
	if err != nil {
		return nil, err
	}
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, fmt.Errorf("redistest: start redis-server: %w", err)
	}
	s := &Server{bin: bin, cfg: cfg, dir: dir}
	if cfg.sentinel != "" {
		if err := os.WriteFile(filepath.Join(dir, sentinelFileName), []byte(cfg.sentinel), 0o644); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("redistest: start redis sentinel: %w", err)
		}
	}
	for attempt := 1; ; attempt++ {
		if err = s.pickPorts(); err == nil {
			s.mu.Lock()
			err = s.spawn()
			s.mu.Unlock()
			if err == nil {
				return s, nil
			}
		}
		s.releasePorts()
		s.port, s.busPort = 0, 0
		// A failed cluster node may have written nodes.conf for the old port.
		_ = os.Remove(filepath.Join(dir, nodesFileName))
		if !errors.Is(err, errAddrInUse) || attempt == startAttempts {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
}

// NewServer starts a redis-server like StartServer, calls tb.Fatal if that
// fails and registers Close with tb.Cleanup.
func NewServer(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	s, err := StartServer(opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// Addr returns the server's address, "127.0.0.1:PORT".
func (s *Server) Addr() string { return net.JoinHostPort(loopback, strconv.Itoa(s.port)) }

// Port returns the server's TCP port on 127.0.0.1.
func (s *Server) Port() int { return s.port }

// URL returns the server's address as "redis://127.0.0.1:PORT", as accepted
// by redis.ParseURL.
func (s *Server) URL() string { return "redis://" + s.Addr() }

// Client returns a new go-redis client for the server and closes it on
// tb.Cleanup. ContextTimeoutEnabled is set, so a context deadline bounds each
// command (go-redis ignores it by default and waits for ReadTimeout, 5 s in
// v9.23).
func (s *Server) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:                  s.Addr(),
		ContextTimeoutEnabled: true,
	})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Close kills the process (SIGKILL to its process group), waits for it to
// exit and removes its temporary directory. It is idempotent, and safe to
// call on a stopped or paused server.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	s.kill()
	_ = os.RemoveAll(s.dir)
	s.releasePorts()
}

// Stop kills the process with SIGKILL, like a crash, and waits for it to
// exit. The port and directory are kept so that Start can bring the server
// back. Stopping a server that is not running is a no-op.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("redistest: stop %s: server is closed", s.Addr())
	}
	s.kill()
	return nil
}

// Start starts a stopped server again on the same port and waits until it
// answers PING. The server comes back empty: nothing is persisted. A cluster
// node keeps its nodes.conf, so it rejoins the cluster with the same node ID
// (a replica then resynchronizes from its master), and a sentinel keeps the
// config file it rewrote, as a restarted Sentinel does in production. Start
// returns an error if the server is running or closed.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("redistest: start %s: server is closed", s.Addr())
	}
	if s.runningLocked() {
		return fmt.Errorf("redistest: start %s: server is already running", s.Addr())
	}
	if err := s.clearData(); err != nil {
		return fmt.Errorf("redistest: start %s: %w", s.Addr(), err)
	}
	// The port can be held for a moment after a crash, e.g. by a client
	// socket that happened to get it as its ephemeral port.
	deadline := time.Now().Add(rebindTimeout)
	for {
		err := s.spawn()
		if err == nil || !errors.Is(err, errAddrInUse) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Pause stops the process with SIGSTOP: connections stay open but nothing is
// answered, as when Redis hangs. Resume undoes it.
func (s *Server) Pause() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.signalLocked(syscall.SIGSTOP, "pause"); err != nil {
		return err
	}
	s.paused = true
	return nil
}

// Resume continues a paused process with SIGCONT.
func (s *Server) Resume() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.signalLocked(syscall.SIGCONT, "resume"); err != nil {
		return err
	}
	s.paused = false
	return nil
}

// Running reports whether the process exists, that is it was started and has
// neither exited nor been stopped or closed. A paused server is running.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runningLocked()
}

func (s *Server) runningLocked() bool {
	if s.closed || s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

func (s *Server) signalLocked(sig syscall.Signal, what string) error {
	if !s.runningLocked() {
		return fmt.Errorf("redistest: %s %s: server is not running", what, s.Addr())
	}
	if err := syscall.Kill(-s.cmd.Process.Pid, sig); err != nil {
		return fmt.Errorf("redistest: %s %s: %w", what, s.Addr(), err)
	}
	return nil
}

// kill SIGKILLs the process group and waits for the process to be reaped.
// SIGKILL also ends a SIGSTOPped process. Called with s.mu held.
func (s *Server) kill() {
	if s.cmd == nil {
		return
	}
	select {
	case <-s.exited:
	default:
		if err := syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL); err != nil {
			_ = s.cmd.Process.Kill()
		}
		<-s.exited
	}
	s.cmd, s.exited, s.paused = nil, nil, false
}

// poll calls check until it succeeds or ctx ends, then reports the last
// reason it failed.
func poll(ctx context.Context, what string, check func(context.Context) error) error {
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("timed out waiting for %s: %w", what, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Main is the whole TestMain of a package whose tests share one
// redis-server: it starts the server, stores it in *s, runs the tests,
// stops the server and exits with the tests' status.
//
//	var server *redistest.Server
//
//	func TestMain(m *testing.M) { redistest.Main(m, &server) }
func Main(m *testing.M, s **Server) {
	srv, err := StartServer()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*s = srv
	code := m.Run()
	srv.Close()
	os.Exit(code)
}
