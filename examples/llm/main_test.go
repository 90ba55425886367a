package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
)

// replica is one example server running as a process of its own.
type replica struct {
	url    string
	stderr *bytes.Buffer
}

// startReplica builds nothing: it runs bin with args and the address it
// printed, and stops it with SIGTERM when the test ends, requiring a clean
// exit (the settles drained).
func startReplica(t *testing.T, bin string, args ...string) *replica {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"-addr", "127.0.0.1:0"}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{stderr: &bytes.Buffer{}}
	cmd.Stderr = &syncWriter{w: r.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- line
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case line := <-lines:
		u, ok := strings.CutPrefix(strings.TrimSpace(line), "listening on ")
		if !ok {
			_ = cmd.Process.Kill()
			t.Fatalf("replica said %q; stderr: %s", line, r.stderr)
		}
		r.url = u
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("replica did not start; stderr: %s", r.stderr)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("replica %s: %v; stderr: %s", r.url, err, r.stderr)
		}
	})
	return r
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

// build compiles the example once for the test.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "llm")
	// go test puts its own go first in PATH.
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// complete asks r for a completion for tenant with query q, and returns
// the response with its body read.
func (r *replica) complete(t *testing.T, tenant, q string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("POST", r.url+"/v1/completions?"+q, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Tenant", tenant)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// storeCalls is how many store calls of the token rule r has made,
// settles included, from its /metrics.
func (r *replica) storeCalls(t *testing.T) int {
	t.Helper()
	resp, err := http.Get(r.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	const series = `tollgate_http_store_duration_seconds_count{rule="tokens"} `
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// remaining is r of the RateLimit header, or -1.
func remaining(h http.Header) int {
	_, r, ok := strings.Cut(h.Get("RateLimit"), ";r=")
	if !ok {
		return -1
	}
	r, _, _ = strings.Cut(r, ";")
	n, err := strconv.Atoi(r)
	if err != nil {
		return -1
	}
	return n
}

// TestTwoReplicas runs two replicas of the example on one redis-server and
// checks that the token budget and the concurrency limit hold across them.
func TestTwoReplicas(t *testing.T) {
	srv := redistest.NewServer(t)
	bin := build(t)
	// 1000 tokens an hour: the budget barely refills while the test runs
	// (a token every 3.6 s), so the counts below hold on a slow machine.
	args := []string{"-redis", srv.URL(), "-tokens", "1000", "-per", "1h", "-concurrent", "2", "-token-delay", "1ms"}
	replicas := []*replica{startReplica(t, bin, args...), startReplica(t, bin, args...)}

	t.Run("tokens", func(t *testing.T) {
		calls := make([]int, len(replicas)) // store calls made by each replica
		for i, step := range []struct {
			query     string
			code      int
			remaining int // after the reservation, as the response says
		}{
			{"max_tokens=200&tokens=300", 200, 800}, // settles to 700
			{"max_tokens=200&fail", 500, 500},       // refunded: 700
			{"max_tokens=200&tokens=300", 200, 500}, // settles to 400
			{"max_tokens=200&tokens=300", 200, 200}, // settles to 100
			{"max_tokens=200&tokens=300", 429, 100}, // 100 left: the estimate does not fit
		} {
			r := replicas[i%2]
			resp, body := r.complete(t, "acme", step.query)
			if resp.StatusCode != step.code {
				t.Fatalf("request %d on replica %d: %d %q, want %d", i+1, i%2, resp.StatusCode, body[:min(len(body), 60)], step.code)
			}
			// A token may have come back since the start.
			if got := remaining(resp.Header); got < step.remaining || got > step.remaining+3 {
				t.Errorf("request %d: RateLimit %q, want r=%d", i+1, resp.Header.Get("RateLimit"), step.remaining)
			}
			if step.code == 429 {
				if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); ra < 300 {
					t.Errorf("Retry-After %q, want about 360 s (100 tokens at 1000 an hour)", resp.Header.Get("Retry-After"))
				}
				break
			}
			if step.code == 200 {
				if got, want := resp.Trailer.Get("X-Tokens-Used"), "300"; got != want {
					t.Errorf("request %d: trailer X-Tokens-Used %q, want %q", i+1, got, want)
				}
			}
			// The settle runs after the response, in the background: wait
			// for it (reserve + settle) before the next request.
			calls[i%2] += 2
			testkit.Eventually(t, "the settle", func() bool { return r.storeCalls(t) >= calls[i%2] })
		}
	})

	t.Run("concurrency", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		const clients = 6
		codes := make(chan int, clients)
		var wg sync.WaitGroup
		for i := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := replicas[i%2]
				req, _ := http.NewRequestWithContext(ctx, "POST", r.url+"/v1/completions?max_tokens=10&tokens=1000&delay=1s", nil)
				req.Header.Set("X-Tenant", "globex")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					codes <- 0
					return
				}
				defer resp.Body.Close()
				if resp.StatusCode == 200 {
					// Generating: a first token streamed, then hold on
					// until the test has counted.
					_, _ = bufio.NewReader(resp.Body).ReadString(' ')
				}
				codes <- resp.StatusCode
				_, _ = io.Copy(io.Discard, resp.Body)
			}()
		}
		got := map[int]int{}
		for range clients {
			got[<-codes]++
		}
		cancel() // the two generations stop; their tokens are settled
		wg.Wait()
		if got[200] != 2 || got[429] != 4 {
			t.Errorf("statuses %v, want 2 generating (200) and 4 refused (429) across the replicas", got)
		}
		// The cancelled generations gave their slots back (and cost a
		// token or two each: a token a second).
		testkit.Eventually(t, "a free slot", func() bool {
			resp, _ := replicas[1].complete(t, "globex", "max_tokens=10&tokens=1")
			return resp.StatusCode == 200
		})
	})
}
