package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMakeRun runs `make run`, README's one command, on free ports (ARGS):
// its first line says that it builds tollgate and that the first build can
// take minutes, before the build starts, so that a slow first build does
// not look hung; then the service it built starts and answers.
func TestMakeRun(t *testing.T) {
	t.Parallel()
	tollgateBinary(t) // the packages compiled once, for both builds
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("make", "-s", "-C", root, "run", "ARGS=--http 127.0.0.1:0 --grpc 127.0.0.1:0")
	cmd.Env = withoutTollgateEnv(os.Environ())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // make, go and tollgate: stopped together
	// A pipe of files: Wait does not wait for its reader.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	cmd.Stdout, cmd.Stderr = pw, pw
	err = cmd.Start()
	pw.Close()
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	}()
	lines := make(chan string, 1000)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default: // no longer read
			}
		}
	}()
	next := func(within time.Duration) (string, bool) {
		select {
		case l, ok := <-lines:
			return l, ok
		case <-time.After(within):
			return "", false
		}
	}
	first, _ := next(time.Minute)
	if !strings.HasPrefix(first, "building tollgate") || !strings.Contains(first, "can take minutes") {
		t.Fatalf("make run's first line is %q, want one saying it builds tollgate and can take minutes", first)
	}
	var seen []string
	for {
		l, ok := next(3 * time.Minute)
		if !ok {
			t.Fatalf("make run ended or went quiet before tollgate listened:\n%s", strings.Join(append([]string{first}, seen...), "\n"))
		}
		seen = append(seen, l)
		if m := listening.FindStringSubmatch(l); m != nil {
			if m[1] == "" || strings.HasSuffix(m[1], ":8080") {
				t.Errorf("listening on %q: ARGS were not passed on", m[1])
			}
			break
		}
	}
	if !strings.Contains(strings.Join(seen, "\n"), "rules loaded") {
		t.Errorf("no rules loaded:\n%s", strings.Join(seen, "\n"))
	}
}
