package main

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/tools/sim"
	"github.com/tollgate/tollgate/redisstore"
)

// runCmd runs the tollgate command line with env and returns its exit code,
// stdout and stderr.
func runCmd(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"tollgate"}, args...), func(k string) string { return env[k] }, &out, &errb)
	return code, out.String(), errb.String()
}

func TestDemoDrain(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t)
	code, out, errs := runCmd(t, map[string]string{"REDIS_URL": srv.URL()}, "demo", "drain")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")[1:]
	want := []string{"allowed=1 remaining=4", "allowed=1 remaining=3", "allowed=1 remaining=2", "allowed=1 remaining=1", "allowed=1 remaining=0"}
	for range 5 {
		want = append(want, "allowed=0 remaining=0 retry_after=500ms")
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("demo drain printed:\n%s", out)
	}
	if !strings.Contains(errs, "using the Redis at "+srv.URL()) {
		t.Errorf("stderr %q does not say which Redis it used", errs)
	}
}

func TestDemoUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args     []string
		code     int
		inStderr string
	}{
		{[]string{"demo"}, 2, "Usage: tollgate demo"},
		{[]string{"demo", "teleport"}, 2, `unknown demo "teleport"`},
		{[]string{"demo", "drain", "extra"}, 2, "unexpected arguments"},
		{[]string{"demo", "refill", "-wait", "soon"}, 2, "invalid value"},
		{[]string{"demo", "race-worker", "bad"}, 1, "want arguments"},
		{[]string{"demo", "-h"}, 0, ""},
	}
	for _, tc := range tests {
		code, out, errs := runCmd(t, nil, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.inStderr) {
			t.Errorf("tollgate %q: exit %d, stderr %q; want %d and %q", tc.args, code, errs, tc.code, tc.inStderr)
		}
		if tc.code == 0 && !strings.Contains(out, "boundary") {
			t.Errorf("tollgate %q does not list the demos: %q", tc.args, out)
		}
	}
}

func TestSimulateCSV(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var csv strings.Builder
	csv.WriteString("time\n")
	for i := range 600 { // 5 requests a second, every 200 ms, for 2 minutes
		fmt.Fprintf(&csv, "%.3f\n", float64(i)*0.2)
	}
	path := filepath.Join(dir, "client.csv")
	if err := os.WriteFile(path, []byte(csv.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCmd(t, nil, "simulate", "-csv", path, "-out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	// 5 per second: p99 5, rate 6 (p99 + 10%, rounded up), burst 25 (5 s).
	for _, want := range []string{"p99 5,", "a token bucket of 6/s", "burst 25 (5 s of p99)", "Limit: 6 per 1s, burst 25", "**client**"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, f := range []string{"client.md", "client.svg"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
}

// TestSimulateLongCSV simulates ten minutes of recorded traffic, far more
// than a tenth of a second's bins can chart: the bin follows the duration,
// and the table and the chart are both written.
func TestSimulateLongCSV(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var csv strings.Builder
	csv.WriteString("time\n")
	for i := range 6000 { // 10 a second for 10 minutes
		fmt.Fprintf(&csv, "%.3f\n", float64(i)*0.1)
	}
	path := filepath.Join(dir, "long.csv")
	if err := os.WriteFile(path, []byte(csv.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCmd(t, nil, "simulate", "-csv", path, "-out", dir)
	if code != 0 {
		t.Errorf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "**long**") {
		t.Errorf("no table on stdout:\n%s", out)
	}
	for _, f := range []string{"long.md", "long.svg"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	if svg, err := os.ReadFile(filepath.Join(dir, "long.svg")); err == nil && !strings.Contains(string(svg), "offered per 1s") {
		t.Errorf("the chart's bin is not 1s")
	}
	// A bin too fine for the chart is refused, but the table is written.
	dir2 := t.TempDir()
	code, _, errs = runCmd(t, nil, "simulate", "-csv", path, "-out", dir2, "-bin", "10ms")
	if code != 1 || !strings.Contains(errs, "use a longer bin") {
		t.Errorf("-bin 10ms: exit %d, %q; want 1 and the bin refused", code, errs)
	}
	if _, err := os.Stat(filepath.Join(dir2, "long.md")); err != nil {
		t.Errorf("-bin 10ms: the table is not written: %v", err)
	}
}

// TestSimulateDayCSV runs the binary on recorded traffic of a day (50,000
// requests) and of a year (4), in Unix times: a table on stdout and in the
// .md, and a chart in the shortest round bin giving each bar a pixel, each
// bar the bin's mean per second, whose size does not grow with the
// requests. A CSV spanning more than 100 years is refused.
func TestSimulateDayCSV(t *testing.T) {
	t.Parallel()
	var day strings.Builder
	for i := range 50_000 { // every 1.728 s, from a Unix time on
		fmt.Fprintf(&day, "%d.%06d,GET /\n", 1764478535+i*1728/1000, i*1728%1000*1000)
	}
	year := "1764478535\n1780246535\n1780246535.5\n1796014535\n" // 0, half a year (twice), a year
	for _, tc := range []struct {
		name, csv string
		want      []string // in the chart
	}{
		{"day", day.String(), []string{"bars: the mean per 1s of each 2m;", ">3h</text>"}},
		{"year", year, []string{"bars: the mean per 1s of each 12h;", ">50d</text>"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			path := filepath.Join(dir, tc.name+".csv")
			if err := os.WriteFile(path, []byte(tc.csv), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := runSimulateBinary(t, "-csv", path, "-out", dir)
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if !strings.Contains(out, "**"+tc.name+"**") || !strings.Contains(out, "| sliding_window_log |") {
				t.Errorf("no table on stdout:\n%s", out)
			}
			if _, err := os.Stat(filepath.Join(dir, tc.name+".md")); err != nil {
				t.Error(err)
			}
			svg, err := os.ReadFile(filepath.Join(dir, tc.name+".svg"))
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range tc.want {
				if !strings.Contains(string(svg), want) {
					t.Errorf("the chart lacks %q:\n%.1500s", want, svg)
				}
			}
			if len(svg) > 2<<20 {
				t.Errorf("the chart takes %d bytes, more than 2 MiB", len(svg))
			}
		})
	}
	t.Run("over 100 years", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "ages.csv")
		if err := os.WriteFile(path, []byte("1\n10000000000\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := runSimulateBinary(t, "-csv", path)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(out, "spans more than 100 years") {
			t.Errorf("%v, want exit 1 and the span refused:\n%s", err, out)
		}
	})
}

// runSimulateBinary runs the tollgate binary's simulate with args and
// returns what it printed.
func runSimulateBinary(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin := tollgateBinary(t) // built first: the deadline is the run's
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, append([]string{"simulate"}, args...)...).CombinedOutput()
	return string(out), err
}

func TestSimulateBadInput(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args     []string
		code     int
		inStderr string
	}{
		{[]string{"simulate", "-pattern", "spiky"}, 2, "unknown pattern"},
		{[]string{"simulate", "-rate", "0"}, 2, "invalid limit"},
		{[]string{"simulate", "-csv", "/nonexistent.csv"}, 1, "no such file"},
		{[]string{"simulate", "-csv", "x.csv", "-pattern", "steady"}, 2, "exclude each other"},
		{[]string{"simulate", "extra"}, 2, "unexpected arguments"},
	}
	for _, tc := range tests {
		code, _, errs := runCmd(t, nil, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.inStderr) {
			t.Errorf("tollgate %q: exit %d, stderr %q; want %d and %q", tc.args, code, errs, tc.code, tc.inStderr)
		}
	}
}

// TestSimulateDocsAreCurrent regenerates the charts and tables committed in
// docs/simulate (docs/algorithms.md, "Choosing an algorithm") and requires
// them to be what the command produces now, and the page to show the tables
// as they are.
// The Redis column is left out of the comparison: MEMORY USAGE depends on
// the Redis version and allocator, while everything else is exact.
func TestSimulateDocsAreCurrent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if code, _, errs := runCmd(t, nil, "simulate", "-out", dir); code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	page, err := os.ReadFile("../../docs/algorithms.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range sim.Patterns {
		for _, ext := range []string{".svg", ".md"} {
			got, err := os.ReadFile(filepath.Join(dir, p+ext))
			if err != nil {
				t.Fatal(err)
			}
			committed, err := os.ReadFile(filepath.Join("../../docs/simulate", p+ext))
			if err != nil {
				t.Fatalf("%v: regenerate with `make simulate`", err)
			}
			if ext == ".md" {
				got, committed = withoutRedisColumn(got), withoutRedisColumn(committed)
				if !bytes.Contains(withoutRedisColumn(page), committed) {
					t.Errorf("docs/algorithms.md does not show docs/simulate/%s.md as it is", p)
				}
			}
			if !bytes.Equal(got, committed) {
				t.Errorf("docs/simulate/%s%s is not what `tollgate simulate` writes now: regenerate it with `make simulate`", p, ext)
			}
		}
	}
}

// TestLabBucketSHA: docs/lab.md's example of make bucket shows the SHA of
// the script as it is now.
func TestLabBucketSHA(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../docs/lab.md")
	if err != nil {
		t.Fatal(err)
	}
	src := redisstore.Source(tollgate.TokenBucket)
	sum := sha1.Sum([]byte(src))
	for _, want := range []string{
		"sha=" + hex.EncodeToString(sum[:]),
		fmt.Sprintf("lua/token_bucket.lua, %d bytes)", len(src)),
	} {
		if !bytes.Contains(readme, []byte(want)) {
			t.Errorf("docs/lab.md's make bucket example lacks %q: update it from `make bucket`", want)
		}
	}
}

var redisCell = regexp.MustCompile(`(?m)\| [^|]* \|$`)

// withoutRedisColumn blanks the last cell of every table row.
func withoutRedisColumn(md []byte) []byte {
	return redisCell.ReplaceAll(md, []byte("| … |"))
}
