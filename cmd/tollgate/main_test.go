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
