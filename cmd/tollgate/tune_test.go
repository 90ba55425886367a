package main

import (
	"bytes"
	"compress/gzip"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runTuneBinary runs the tollgate binary's tune in dir and returns its exit
// code, stdout and stderr.
func runTuneBinary(t *testing.T, dir string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(tollgateBinary(t), append([]string{"tune"}, args...)...)
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errb.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), out.String(), errb.String()
	}
	t.Fatal(err)
	return 0, "", ""
}

// tuneLog writes 30 seconds of 20 clients, the i-th (from 1) sending i
// requests every second, as nginx's combined format or as JSON lines.
func tuneLog(w io.Writer, format string) {
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for s := range 30 {
		at := start.Add(time.Duration(s) * time.Second)
		for i := 1; i <= 20; i++ {
			for k := range i {
				switch format {
				case "nginx":
					fmt.Fprintf(w, "10.9.0.%d - - [%s] \"GET /a HTTP/1.1\" 200 10 \"-\" \"t\"\n", i, at.Format("02/Jan/2006:15:04:05 -0700"))
				case "json":
					fmt.Fprintf(w, "{\"at\":\"%s\",\"who\":{\"key\":\"k%d\"}}\n", at.Add(time.Duration(k)*time.Second/time.Duration(i)).Format(time.RFC3339Nano), i)
				}
			}
		}
	}
}

func TestTune(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var nginx, js, gz bytes.Buffer
	tuneLog(&nginx, "nginx")
	tuneLog(&js, "json")
	z := gzip.NewWriter(&gz)
	z.Write(nginx.Bytes())
	z.Close()
	for name, data := range map[string][]byte{"access.log": nginx.Bytes(), "app.jsonl": js.Bytes(), "access.log.gz": gz.Bytes(),
		"bad.log": []byte("garbage\n\nnot a log line either\n")} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// 20 clients at 1 to 20 a second: the p99 of their p99s is 20, the
	// rate 22, the burst 5 s of 20; nobody is over it.
	recommended := "Recommended, for each client: a token bucket of 22/s (20, the p99 of the clients' p99s, + 10%), burst 100 (5 s of 20): 100.00% of the clients never limited."
	requests := fmt.Sprintf("%d requests of 20 clients", 30*20*21/2)
	tests := []struct {
		name string
		args []string
		code int
		out  []string // parts of stdout
		err  string   // a part of stderr
	}{
		{"nginx", []string{"access.log"}, 0, []string{"Log (nginx): 6300 lines", requests, "; 0 bad lines.", recommended,
			"rate_limit: {unit: second, requests_per_unit: 22, algorithm: token_bucket, burst: 100}",
			"| token_bucket (burst 100) | 0 (0.00%) | 0 (0.00%) |", "| fixed_window | 0 (0.00%) | 0 (0.00%) |"}, ""},
		{"gzip", []string{"access.log.gz"}, 0, []string{"Log (nginx): 6300 lines", recommended}, ""},
		{"JSON lines, nested fields, flags after the log", []string{"--client", "who.key", "--time", "at", "app.jsonl"}, 0,
			[]string{"Log (json): 6300 lines", requests, recommended}, ""},
		{"bounded clients", []string{"--max-clients", "5", "access.log"}, 0,
			[]string{"of 5 clients", "More than 5 clients: the 5850 requests of the clients first seen after the first 5 are not analysed"}, ""},
		{"no request in the log", []string{"--format", "nginx", "bad.log"}, 1, nil,
			"tollgate tune: no request in 3 lines (2 bad; line 1: not nginx's combined format"},
		{"no such log", []string{"nope.log"}, 1, nil, "tollgate tune: open nope.log: no such file or directory"},
		{"usage: no log", nil, 2, nil, "give one access log"},
		{"usage: two logs", []string{"a.log", "b.log"}, 2, nil, "give one access log"},
		{"usage: standard input", []string{"-"}, 2, nil, "must be a file, not standard input"},
		{"usage: no clients", []string{"--max-clients", "0", "access.log"}, 2, nil, "--max-clients 0: want 1 to 1000000"},
		{"usage: a format", []string{"--format", "apache", "access.log"}, 2, nil, `--format "apache": want nginx, json or csv`},
		{"usage: unknown flag", []string{"--clients", "x", "access.log"}, 2, nil, "unknown flag --clients (did you mean --client?)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, out, errs := runTuneBinary(t, dir, tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, out, errs)
			}
			for _, want := range tc.out {
				if !strings.Contains(out, want) {
					t.Errorf("stdout lacks %q:\n%s", want, out)
				}
			}
			if tc.out == nil && out != "" {
				t.Errorf("stdout %q, want nothing", out)
			}
			if !strings.Contains(errs, tc.err) {
				t.Errorf("stderr %q, want it to contain %q", errs, tc.err)
			}
		})
	}
}

// TestTuneSVG: --svg writes the chart, well-formed, with the
// recommendation in it.
func TestTuneSVG(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var log bytes.Buffer
	tuneLog(&log, "nginx")
	if err := os.WriteFile(filepath.Join(dir, "access.log"), log.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := runTuneBinary(t, dir, "--svg", "clients.svg", "access.log"); code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	svg, err := os.ReadFile(filepath.Join(dir, "clients.svg"))
	if err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(svg))
	for {
		if _, err := dec.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("clients.svg is not well-formed: %v", err)
		}
	}
	for _, want := range []string{"access.log: requests per second of each client, ranked by their p99", "a token bucket of 22/s, burst 100", "20 clients"} {
		if !bytes.Contains(svg, []byte(want)) {
			t.Errorf("clients.svg lacks %q", want)
		}
	}
}
