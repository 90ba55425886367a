// Package promtest runs a real Prometheus server for tollgate's tests, and
// tests tollgate's Prometheus rules and Grafana dashboard
// (deploy/prometheus, deploy/grafana) with it and with promtool.
//
// A Server scrapes the targets it is given every second and evaluates the
// rule files it is given every second, on a free loopback port, with its
// storage in a temporary directory; its queries go through the HTTP API,
// as Grafana's do. Debian's prometheus package (2.42) provides both
// programs: make deps installs it.
package promtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Target is one scrape target: its job name and its address, whose
// /metrics Prometheus reads.
type Target struct {
	Job, Addr string
}

// Server is a running Prometheus.
type Server struct {
	url string
	log *Output
}

// Binary returns the path of name (prometheus, promtool) or fails tb,
// saying how to install it.
func Binary(tb testing.TB, name string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		tb.Fatalf("promtest: %s not found (%v): make deps installs it (Debian: apt-get install prometheus)", name, err)
	}
	return p
}

// Start starts a Prometheus that scrapes targets and evaluates ruleFiles,
// each every second, and stops it when tb ends. It returns once Prometheus
// is ready.
func Start(tb testing.TB, targets []Target, ruleFiles ...string) *Server {
	tb.Helper()
	bin := Binary(tb, "prometheus")
	dir := tb.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, config(targets, ruleFiles), 0o644); err != nil {
		tb.Fatal(err)
	}
	var lastErr error
	for range 3 { // a port picked free can be taken before Prometheus binds it
		s, err := start(tb, bin, cfg, filepath.Join(dir, "data"))
		if err == nil {
			return s
		}
		lastErr = err
	}
	tb.Fatal(lastErr)
	return nil
}

// config is a Prometheus configuration scraping targets and evaluating
// ruleFiles every second.
func config(targets []Target, ruleFiles []string) []byte {
	var b bytes.Buffer
	b.WriteString("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n")
	if len(ruleFiles) > 0 {
		b.WriteString("rule_files:\n")
		for _, f := range ruleFiles {
			fmt.Fprintf(&b, "  - %q\n", f)
		}
	}
	b.WriteString("scrape_configs:\n")
	for _, t := range targets {
		fmt.Fprintf(&b, "  - job_name: %q\n    static_configs:\n      - targets: [%q]\n", t.Job, t.Addr)
	}
	return b.Bytes()
}

func start(tb testing.TB, bin, cfg, data string) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cmd := exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+data,
		"--web.listen-address="+addr, "--log.level=warn")
	log := new(Output)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("promtest: start prometheus: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stop := func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	s := &Server{url: "http://" + addr, log: log}
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-done:
			return nil, fmt.Errorf("promtest: prometheus on %s exited: %v\n%s", addr, err, log)
		case <-time.After(50 * time.Millisecond):
		}
		if s.ready() {
			tb.Cleanup(stop)
			return s, nil
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("promtest: prometheus on %s not ready after 30s\n%s", addr, log)
		}
	}
}

func (s *Server) ready() bool {
	resp, err := http.Get(s.url + "/-/ready")
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Log is what Prometheus has written to its standard output and error.
func (s *Server) Log() string { return s.log.String() }

// Sample is one series of an instant query's answer: its labels and value
// (NaN and ±Inf included).
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Query evaluates expr now through /api/v1/query, as a dashboard panel's
// query is, and returns its series. The answer must be an instant vector.
func (s *Server) Query(ctx context.Context, expr string) ([]Sample, error) {
	var data struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	}
	if err := s.get(ctx, "/api/v1/query?query="+url.QueryEscape(expr), &data); err != nil {
		return nil, fmt.Errorf("promtest: query %s: %w", expr, err)
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("promtest: query %s: a %s, want a vector", expr, data.ResultType)
	}
	out := make([]Sample, 0, len(data.Result))
	for _, r := range data.Result {
		str, ok := r.Value[1].(string)
		if !ok {
			return nil, fmt.Errorf("promtest: query %s: value %v is not a string", expr, r.Value[1])
		}
		v, err := strconv.ParseFloat(str, 64) // Prometheus writes NaN, +Inf, -Inf as ParseFloat reads them
		if err != nil {
			return nil, fmt.Errorf("promtest: query %s: value %q: %w", expr, str, err)
		}
		out = append(out, Sample{Labels: r.Metric, Value: v})
	}
	return out, nil
}

// Names returns the names of every series Prometheus holds
// (/api/v1/label/__name__/values).
func (s *Server) Names(ctx context.Context) ([]string, error) {
	var names []string
	if err := s.get(ctx, "/api/v1/label/__name__/values", &names); err != nil {
		return nil, fmt.Errorf("promtest: metric names: %w", err)
	}
	return names, nil
}

// get reads the data of an API answer at path into data.
func (s *Server) get(ctx context.Context, path string, data any) error {
	req, err := http.NewRequestWithContext(ctx, "GET", s.url+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	var answer struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &answer); err != nil {
		return fmt.Errorf("%s: %w: %.200s", resp.Status, err, body)
	}
	if answer.Status != "success" {
		return errors.New(answer.Error)
	}
	return json.Unmarshal(answer.Data, data)
}

// freePort returns a port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("promtest: pick a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Output is a process's output (its standard output and error), written
// and read concurrently.
type Output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Output) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *Output) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
