package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// spawn starts redis-server on s.port and waits until that very process
// answers. Called with s.mu held.
func (s *Server) spawn() error {
	out, err := os.OpenFile(filepath.Join(s.dir, stdoutFileName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("redistest: start redis-server: %w", err)
	}
	for i, name := range logFiles {
		s.logPos[i] = 0
		if fi, err := os.Stat(filepath.Join(s.dir, name)); err == nil {
			s.logPos[i] = fi.Size()
		}
	}
	cmd := exec.Command(s.bin, s.args()...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = out, out // an *os.File: no copying goroutines
	cmd.SysProcAttr = sysProcAttr()
	err = startProcess(cmd)
	_ = out.Close()
	if err != nil {
		return fmt.Errorf("redistest: start redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited, s.paused = cmd, exited, false

	if err := s.waitReady(); err != nil {
		s.kill()
		return err
	}
	return nil
}

// waitReady polls the port until our process answers PING and INFO reports
// its pid (so a server another test started on the same port is not mistaken
// for ours), the process exits, or readyTimeout passes.
func (s *Server) waitReady() error {
	deadline := time.Now().Add(readyTimeout)
	var lastErr error
	for {
		select {
		case <-s.exited:
			state := s.cmd.ProcessState.String()
			tail := s.logTail()
			if strings.Contains(tail, "Address already in use") {
				return fmt.Errorf("redistest: start redis-server on %s: process exited (%s): %w%s", s.Addr(), state, errAddrInUse, tail)
			}
			return fmt.Errorf("redistest: start redis-server on %s: process exited (%s)%s", s.Addr(), state, tail)
		default:
		}
		pid, err := probe(s.Addr())
		if err == nil && pid == s.cmd.Process.Pid {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("port answered by another redis-server (pid %d)", pid)
		}
		lastErr = err
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: start redis-server on %s: no answer after %v: %w%s", s.Addr(), readyTimeout, lastErr, s.logTail())
		}
		time.Sleep(pollInterval)
	}
}

func (s *Server) args() []string {
	a := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", loopback,
		"--daemonize", "no",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--logfile", filepath.Join(s.dir, logFileName),
		"--protected-mode", "no",
		// The default waits 5 s for more replicas before a full sync.
		"--repl-diskless-sync-delay", "0",
	}
	if s.cfg.sentinel != "" {
		// The config file must be the first argument.
		a = append([]string{filepath.Join(s.dir, sentinelFileName), "--sentinel"}, a...)
	}
	if s.cfg.cluster {
		a = append(a,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(s.dir, nodesFileName),
			"--cluster-node-timeout", strconv.Itoa(int(ClusterNodeTimeout/time.Millisecond)),
			"--cluster-port", strconv.Itoa(s.busPort),
			// Redis 7.0 leaves a replica out of CLUSTER SLOTS (so clients
			// do not see it) while its replication offset is 0, and an idle
			// master only advances it with its replica PING, every 10 s by
			// default.
			"--repl-ping-replica-period", "1",
		)
	}
	return append(a, s.cfg.args...)
}

// clearData removes everything a previous run may have left for a restart to
// load (an RDB received by a replica, an AOF enabled through WithArgs), but
// keeps the logs, a cluster node's nodes.conf and a sentinel's config file.
func (s *Server) clearData() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		switch e.Name() {
		case logFileName, stdoutFileName, nodesFileName, sentinelFileName:
			continue
		}
		if err := os.RemoveAll(filepath.Join(s.dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// logFiles are the files a process writes to, in the order of Server.logPos.
var logFiles = [2]string{logFileName, stdoutFileName}

// logTail returns the last lines the current process wrote to the redis log
// and to stdout/stderr (config errors go there), ready to append to an error.
// Called with s.mu held.
func (s *Server) logTail() string {
	var b strings.Builder
	for i, name := range logFiles {
		if t := tailFile(filepath.Join(s.dir, name), s.logPos[i], 15); t != "" {
			fmt.Fprintf(&b, "\n--- %s (tail) ---\n%s", name, t)
		}
	}
	return b.String()
}

// tailFile returns at most the last n lines of path written after offset from.
func tailFile(path string, from int64, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const maxBytes = 4096
	if fi, err := f.Stat(); err == nil {
		from = max(from, fi.Size()-maxBytes)
	}
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return ""
	}
	data, _ := io.ReadAll(f)
	ls := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.TrimSpace(strings.Join(ls, "\n"))
}

// probe sends PING and INFO server over a fresh connection with short
// timeouts and returns the process_id the server reports.
func probe(addr string) (int, error) {
	conn, err := net.DialTimeout("tcp", addr, probeTimeout)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(probeTimeout))
	if _, err := io.WriteString(conn, "*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n"); err != nil {
		return 0, err
	}
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	if line != "+PONG\r\n" {
		return 0, fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	line, err = r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	if !strings.HasPrefix(line, "$") {
		return 0, fmt.Errorf("INFO answered %q", strings.TrimSpace(line))
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("INFO answered %q", strings.TrimSpace(line))
	}
	body := make([]byte, n+2)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, err
	}
	if v, ok := infoField(string(body), "process_id"); ok {
		return strconv.Atoi(v)
	}
	return 0, errors.New("INFO has no process_id")
}

// infoField returns the value of "key:value" in an INFO or CLUSTER INFO reply.
func infoField(info, key string) (string, bool) {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+":"); ok {
			return v, true
		}
	}
	return "", false
}

func findBinary() (string, error) {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	if fi, err := os.Stat(defaultBinary); err == nil && !fi.IsDir() {
		return defaultBinary, nil
	}
	return "", errors.New("redistest: start redis-server: redis-server not found in PATH or at " + defaultBinary +
		"; install it with `apt-get install -y redis-server`")
}
