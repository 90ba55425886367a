package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestUnknownCommand(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"tollgate", "frobnicate"}, func(string) string { return "" }, &out, &errb)
	if code != 2 {
		t.Errorf("exit code = %d, want 2", code)
	}
	if !strings.Contains(errb.String(), `unknown command "frobnicate"`) {
		t.Errorf("stderr = %q, want it to name the unknown command", errb.String())
	}
}

func TestHelpListsCommands(t *testing.T) {
	var out bytes.Buffer
	if code := run(context.Background(), []string{"tollgate", "help"}, func(string) string { return "" }, &out, &out); code != 0 {
		t.Errorf("exit code = %d, want 0", code)
	}
	for _, c := range commands {
		if !strings.Contains(out.String(), c.name) {
			t.Errorf("help does not list %q", c.name)
		}
	}
}

// Run as /bin/ratelimit, envoyproxy/ratelimit's path in its image (what
// Envoy Gateway and Istio's sample run, with no arguments), the binary is
// tollgate serve.
func TestRunAsRatelimitIsServe(t *testing.T) {
	tests := []struct {
		argv0 string
		want  string
	}{
		{"/bin/ratelimit", "Usage: tollgate serve"},
		{"ratelimit", "Usage: tollgate serve"},
		{"/usr/local/bin/tollgate", "Usage: tollgate <command>"},
	}
	for _, tc := range tests {
		t.Run(tc.argv0, func(t *testing.T) {
			var out bytes.Buffer
			run(context.Background(), []string{tc.argv0, "-h"}, func(string) string { return "" }, &out, &out)
			if got := out.String(); !strings.Contains(got, tc.want) {
				t.Errorf("%s -h printed\n%.200s\nwant %q", tc.argv0, got, tc.want)
			}
		})
	}
}
