package redisstore_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"
)

// The multi-process tests re-execute this test binary as child processes
// that must run at once. A child connects, prints "ready" and waits for
// its standard input to close, which the parent does for all of them once
// each is ready: however long a busy machine takes to start a process,
// none begins before its siblings can.

// waitGo tells the parent that this child is ready and returns when the
// parent lets it go.
func waitGo() {
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// child is a running child process: its output after "ready", to read to
// the end before Wait, and its standard error.
type child struct {
	cmd    *exec.Cmd
	out    *bufio.Reader
	stderr *bytes.Buffer
}

// wait waits for the child to exit, after its output was read to the end.
func (c *child) wait() error {
	if err := c.cmd.Wait(); err != nil {
		return fmt.Errorf("%w: %s", err, c.stderr)
	}
	return nil
}

// startTogether starts one child per entry of envs, each with that entry
// added to its environment, waits until every one is ready, and lets them
// all go. A child that is not ready fails the test; every child is killed
// at the test's end if it still runs.
func startTogether(t *testing.T, envs ...string) []*child {
	t.Helper()
	kids := make([]*child, len(envs))
	ins := make([]io.Closer, len(envs))
	for i, env := range envs {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), env)
		c := &child{cmd: cmd, stderr: &bytes.Buffer{}}
		cmd.Stderr = c.stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		c.out = bufio.NewReader(out)
		kids[i], ins[i] = c, in
	}
	for i, c := range kids {
		if line, err := c.out.ReadString('\n'); line != "ready\n" {
			rest, _ := io.ReadAll(c.out)
			werr := c.cmd.Wait()
			t.Fatalf("child %d printed %q (%v) where it says it is ready, then %q (exit %v): %s", i, line, err, rest, werr, c.stderr)
		}
	}
	for _, in := range ins {
		_ = in.Close()
	}
	return kids
}
