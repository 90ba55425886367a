package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runBinary runs the tollgate binary with args, outside envoy's mode, and
// returns its exit status, stdout and stderr. It must end by itself.
func runBinary(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	bin := tollgateBinary(t) // built first: the deadline is the run's
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = withoutTollgateEnv(os.Environ())
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("tollgate %q still running after 20s:\n%s%s", args, out.String(), errb.String())
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return code, out.String(), errb.String()
}

// TestFlagErrorsAreShort gives each command a flag it does not have, or a
// value a flag cannot take: exit status 2 and two lines — the error, with
// the nearest flag for a typo, and where the flags are listed — not the
// whole list, which would push the error out of sight.
func TestFlagErrorsAreShort(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string // in the first line
	}{
		{[]string{"serve", "--confg", "rules.yaml"}, "tollgate serve: unknown flag --confg (did you mean --config?)"},
		{[]string{"serve", "-confg", "rules.yaml"}, "tollgate serve: unknown flag --confg (did you mean --config?)"},
		{[]string{"serve", "--trusted_proxies", "10.0.0.0/8"}, "unknown flag --trusted_proxies (did you mean --trusted-proxies?)"},
		{[]string{"serve", "--redsi", "redis://127.0.0.1:6379"}, "unknown flag --redsi (did you mean --redis?)"},
		{[]string{"serve", "--zzzzzz"}, "tollgate serve: unknown flag --zzzzzz"},
		{[]string{"serve", "--drain-timeout", "soon"}, `tollgate serve: invalid value "soon" for flag --drain-timeout`},
		{[]string{"serve", "--config"}, "tollgate serve: flag needs an argument: --config"},
		{[]string{"serve", "--watch=maybe"}, `tollgate serve: invalid boolean value "maybe" for --watch`},
		{[]string{"proxy", "--upstreem", "http://127.0.0.1:1"}, "tollgate proxy: unknown flag --upstreem (did you mean --upstream?)"},
		{[]string{"simulate", "--rat", "5"}, "tollgate simulate: unknown flag --rat (did you mean --rate?)"},
		{[]string{"demo", "refill", "--wiat", "1s"}, "tollgate demo refill: unknown flag --wiat (did you mean --wait?)"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			code, _, stderr := runBinary(t, tc.args...)
			lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
			cmd := "tollgate " + tc.args[0]
			if tc.args[0] == "demo" {
				cmd += " " + tc.args[1]
			}
			if code != 2 || len(lines) != 2 || !strings.Contains(lines[0], tc.want) || lines[1] != "Run '"+cmd+" -h' for its flags." {
				t.Errorf("exit %d, stderr:\n%s\nwant exit 2, a first line with %q and a pointer to %s -h", code, stderr, tc.want, cmd)
			}
		})
	}
}

// TestHelpOfACommand: "tollgate help serve" prints serve's flags on stdout,
// as "tollgate serve -h" does on stderr; an unknown name is refused.
func TestHelpOfACommand(t *testing.T) {
	t.Parallel()
	for _, c := range []string{"serve", "proxy", "simulate", "demo"} {
		code, stdout, _ := runBinary(t, "help", c)
		if code != 0 || !strings.Contains(stdout, "Usage: tollgate "+c) {
			t.Errorf("tollgate help %s: exit %d, stdout:\n%.300s\nwant exit 0 and the command's usage", c, code, stdout)
		}
		_, _, hstderr := runBinary(t, c, "-h")
		if c != "demo" && stdout != hstderr {
			t.Errorf("tollgate help %s prints other than tollgate %s -h", c, c)
		}
	}
	if code, _, stderr := runBinary(t, "help", "serv"); code != 2 || !strings.Contains(stderr, `unknown command "serv"`) {
		t.Errorf("tollgate help serv: exit %d, stderr %q; want 2 and the command named", code, stderr)
	}
}

// TestBadFlagValuesBeforeLoading starts serve and proxy with flag values
// that cannot work: they stop with exit status 2 before loading the rules,
// naming the flag, and a credential in a refused --redis URL is not shown.
func TestBadFlagValuesBeforeLoading(t *testing.T) {
	t.Parallel()
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rules, rulesFile(5))
	serve := []string{"serve", "--config", rules, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}
	proxy := []string{"proxy", "--config", rules, "--upstream", "http://127.0.0.1:1", "--http", "127.0.0.1:0", "--listen", "127.0.0.1:0"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(serve, "--trusted-proxies", "10.0.0.0/33"), "--trusted-proxies"},
		{append(serve, "--descriptor", "header:"), "--descriptor"},
		{append(serve, "--redis", "http://user:"+secretMarker+"@127.0.0.1:6379"), "--redis"},
		{append(serve, "--redis", "127.0.0.1:6379"), "--redis"},
		{append(proxy, "--trusted-proxies", "10.0.0.0/33"), "--trusted-proxies"},
		{append(proxy, "--descriptor", "header:"), "--descriptor"},
		{append(proxy, "--redis", "http://user:"+secretMarker+"@127.0.0.1:6379"), "--redis"},
	} {
		t.Run(strings.Join(tc.args[len(tc.args)-2:], " "), func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := runBinary(t, tc.args...)
			out := stdout + stderr
			if code != 2 || !strings.Contains(stderr, "tollgate "+tc.args[0]+": "+tc.want) {
				t.Errorf("exit %d, output:\n%s\nwant exit 2 and an error naming %s", code, out, tc.want)
			}
			if strings.Contains(out, "rules loaded") || strings.Contains(out, "level=") {
				t.Errorf("refused only after starting:\n%s", out)
			}
			if strings.Contains(out, secretMarker) {
				t.Errorf("the password is shown:\n%s", out)
			}
		})
	}
}

// TestLimitErrorsSayItOnce: a limit simulate cannot take is a flag error
// (exit 2), whichever algorithm refuses it, said once as "invalid limit"
// after the command's name, without the library's prefixes.
func TestLimitErrorsSayItOnce(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"simulate", "-rate", "0"},
		{"simulate", "-rate", "2000", "-pattern", "steady", "-duration", "1s"}, // over the sliding log's MaxLogRate
	} {
		code, _, stderr := runBinary(t, args...)
		if code != 2 || !strings.HasPrefix(stderr, "tollgate simulate: invalid limit: ") || strings.Count(stderr, "tollgate") != 1 {
			t.Errorf("tollgate %q: exit %d, stderr %q; want 2 and \"tollgate simulate: invalid limit: …\"", args, code, stderr)
		}
	}
}
