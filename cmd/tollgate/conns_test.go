package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/connectivity"
)

// TestServeClosesIdleAndSlowConnections holds more connections than the
// service has file descriptors: half idle on keep-alive after a request,
// half sending a body a byte at a time. The service closes every one of
// them within its configured bounds, and /healthcheck, unreachable while
// they hold the descriptors, answers again.
func TestServeClosesIdleAndSlowConnections(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, rulesFile(10))
	p := startTollgateWith(t, launch{nofile: 200}, "serve", "--config", path,
		"--read-timeout", "2s", "--idle-timeout", "2s", "--write-timeout", "5s", "--log-format", "json")
	addr := strings.TrimPrefix(p.http, "http://")

	const each = 130
	var conns []net.Conn
	for i := range 2 * each {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c)
		t.Cleanup(func() { c.Close() })
		if i < each {
			// Idle on keep-alive once its request is answered.
			io.WriteString(c, "GET /healthcheck HTTP/1.1\r\nHost: tollgate\r\n\r\n")
		} else {
			io.WriteString(c, "POST /json HTTP/1.1\r\nHost: tollgate\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
		}
	}
	// The slow ones send a byte every half second until they are cut off
	// or the test ends.
	done := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(done); wg.Wait() }()
	for _, c := range conns[each:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(500 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-done:
					return
				case <-tick.C:
					if _, err := c.Write([]byte(" ")); err != nil {
						return
					}
				}
			}
		}()
	}

	// /healthcheck answers once the bounds have freed descriptors: 2 s
	// each, and a minute is far beyond what a loaded machine adds.
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	start := time.Now()
	var last error
	for {
		resp, err := client.Get(p.http + "/healthcheck")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
			err = errors.New(resp.Status)
		}
		last = err
		if time.Since(start) > time.Minute {
			t.Fatalf("/healthcheck unanswered for a minute with %d idle and %d slow connections open: %v", each, each, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("/healthcheck answered after %v", time.Since(start).Round(100*time.Millisecond))

	// Every connection is closed by the service: reading reaches the end
	// (after the answer, for the idle ones), never the test's deadline.
	if open := stillOpen(conns, time.Minute); open > 0 {
		t.Errorf("%d of %d connections still open a minute later; want all closed by --read-timeout and --idle-timeout (2s)", open, len(conns))
	}
	// The HTTP server's own complaints (accept errors while descriptors
	// ran out) are in the service's log format too.
	p.stop()
	for _, line := range strings.Split(strings.TrimSuffix(p.log.String(), "\n"), "\n") {
		var v map[string]any
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Errorf("not JSON: %s", line)
		}
	}
}

// TestServeClosesIdleGRPCConnections: a gRPC connection that never
// completes its handshake is closed, and one with no calls is sent away
// (GOAWAY) so that its client goes idle.
func TestServeClosesIdleGRPCConnections(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, rulesFile(10))
	p := startTollgate(t, "serve", "--config", path, "--grpc-max-connection-idle", "2s", "--grpc-handshake-timeout", "2s")

	silent, err := net.Dial("tcp", p.grpc)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()

	p.ask(request("reload", desc("k", randomID())))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for s := p.conn.GetState(); s == connectivity.Ready; s = p.conn.GetState() {
		if !p.conn.WaitForStateChange(ctx, s) {
			t.Fatalf("gRPC client still %v a minute after its last call; want it sent away after --grpc-max-connection-idle (2s)", s)
		}
	}

	silent.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := io.Copy(io.Discard, silent); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a connection that sent nothing is still open a minute later; want it closed after --grpc-handshake-timeout (2s)")
	}
	// The service still answers.
	p.ask(request("reload", desc("k", randomID())))
}

// stillOpen reads every connection to its end and returns how many were
// not closed by the other side within d.
func stillOpen(conns []net.Conn, d time.Duration) int {
	deadline := time.Now().Add(d)
	open := 0
	for _, c := range conns {
		c.SetReadDeadline(deadline)
		if _, err := io.Copy(io.Discard, c); errors.Is(err, os.ErrDeadlineExceeded) {
			open++
		}
	}
	return open
}

// TestProxyClosesIdleAndSlowConnections: the proxy's listener and its
// admin listener have the same bounds as serve's.
func TestProxyClosesIdleAndSlowConnections(t *testing.T) {
	t.Parallel()
	app := upstreamApp(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rules, "domain: api\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 100}\n")
	p := startTollgate(t, "proxy", "--config", rules, "--upstream", app.URL, "--read-timeout", "2s", "--idle-timeout", "2s")
	var conns []net.Conn
	for _, tc := range []struct{ base, request string }{
		{p.proxy, "GET /items HTTP/1.1\r\nHost: api\r\n\r\n"},
		{p.proxy, "POST /items HTTP/1.1\r\nHost: api\r\nContent-Length: 1000\r\n\r\n{"},
		{p.http, "GET /healthcheck HTTP/1.1\r\nHost: api\r\n\r\n"},
		{p.http, "POST /json HTTP/1.1\r\nHost: api\r\nContent-Length: 1000\r\n\r\n{"},
	} {
		c, err := net.Dial("tcp", strings.TrimPrefix(tc.base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, tc.request)
		conns = append(conns, c)
	}
	if open := stillOpen(conns, time.Minute); open > 0 {
		t.Errorf("%d of %d connections still open a minute later; want all closed by --read-timeout and --idle-timeout (2s)", open, len(conns))
	}
	if code, _ := p.get("/healthcheck"); code != 200 {
		t.Errorf("/healthcheck: %d, want 200", code)
	}
}

// A bound of zero would mean no bound at all: refused at start.
func TestConnectionBoundsValidated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--read-timeout", "0"}, "--read-timeout 0s: want a positive duration"},
		{[]string{"serve", "--idle-timeout", "-1s"}, "--idle-timeout -1s: want a positive duration"},
		{[]string{"serve", "--grpc-max-connection-idle", "0"}, "--grpc-max-connection-idle 0s"},
		{[]string{"serve", "--grpc-max-concurrent-streams", "0"}, "--grpc-max-concurrent-streams 0"},
		{[]string{"serve", "--debug", "127.0.0.1:0", "--debug-write-timeout", "0"}, "--debug-write-timeout 0s"},
		{[]string{"serve", "--max-header-bytes", "100"}, "--max-header-bytes 100: want at least 4096"},
		{[]string{"serve", "--grpc-max-header-bytes", "100"}, "--grpc-max-header-bytes 100: want 4096 to"},
		{[]string{"serve", "--grpc-max-waiting-calls", "0"}, "--grpc-max-waiting-calls 0: want a positive number"},
		{[]string{"serve", "--grpc-message-timeout", "0"}, "--grpc-message-timeout 0s: want a positive duration"},
		{[]string{"serve", "--config", "rules.yaml", "--max-metric-names", "0"}, "--max-metric-names 0: want a positive number"},
		{[]string{"serve", "--config", "rules.yaml", "--max-metric-name-bytes", "-1"}, "--max-metric-name-bytes -1: want a positive number"},
		{[]string{"serve", "--config", "rules.yaml", "--fail-closed-retry-after", "0"}, "--fail-closed-retry-after 0s: want a positive duration"},
		{[]string{"proxy", "--write-timeout", "0"}, "--write-timeout 0s"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errb strings.Builder
			code := run(context.Background(), append([]string{"tollgate"}, tc.args...), func(string) string { return "" }, &out, &errb)
			if code != 2 || !strings.Contains(errb.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want 2 and %q", code, errb.String(), tc.want)
			}
		})
	}
}
