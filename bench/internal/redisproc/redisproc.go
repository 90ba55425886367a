// Package redisproc starts a redis-server for the benchmarks: on a free
// loopback port, with no persistence, in a temporary directory, killed with
// the benchmark. (The main module's internal/test/redistest does this for tests,
// but an internal package cannot be imported from this module.)
package redisproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a running redis-server.
type Server struct {
	Addr string
	cmd  *exec.Cmd
	dir  string
}

// Start starts redis-server (from PATH, else /usr/bin) and waits until it
// answers PING.
func Start() (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		bin = "/usr/bin/redis-server"
		if _, err := os.Stat(bin); err != nil {
			return nil, errors.New("redisproc: redis-server not found: install it (apt-get install redis-server)")
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("redisproc: pick a port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "tollgate-bench-redis-")
	if err != nil {
		return nil, fmt.Errorf("redisproc: %w", err)
	}
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir}
	s.cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", dir+"/redis.log", "--protected-mode", "no", "--daemonize", "no")
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("redisproc: start %s: %w", bin, err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return s, nil
		}
		if time.Now().After(deadline) {
			s.Close()
			return nil, fmt.Errorf("redisproc: redis-server on %s does not answer: %w", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Pid returns the server's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// CPU returns the CPU time (user + system) the server has used, from
// /proc/<pid>/stat, in clock ticks of 1/100 s (Linux's USER_HZ).
func (s *Server) CPU() (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(s.Pid()) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0, errors.New("redisproc: short /proc stat")
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("redisproc: unreadable /proc stat")
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// Close kills the server and removes its directory.
func (s *Server) Close() {
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	_ = s.cmd.Wait()
	os.RemoveAll(s.dir)
}
