package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/test/testkit"
)

// The tests below change the rules under a running tollgate serve the way
// deployments and attackers do, and check what it answers afterwards.

// rulesLimitOf asks p for the limit of the rules written by rulesFile.
func rulesLimitOf(p *proc) uint32 {
	p.t.Helper()
	return p.ask(request("reload", desc("k", randomID()))).Statuses[0].CurrentLimit.GetRequestsPerUnit()
}

// awaitRulesLimit waits until p answers with limit want. retry, when not
// nil, runs every 200ms meanwhile: the file watch starts asynchronously, so
// the first change is repeated until it is seen.
func awaitRulesLimit(t *testing.T, p *proc, want uint32, retry func()) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	next := time.Now()
	for {
		got := rulesLimitOf(p)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("limit still %d after 15s, want %d", got, want)
		}
		if retry != nil && time.Now().After(next) {
			retry()
			next = time.Now().Add(200 * time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// hostileAliasBomb is a few hundred bytes of rules whose descriptors double
// at each of 24 levels through aliases: 2^25 rules once expanded.
func hostileAliasBomb() string {
	var b strings.Builder
	b.WriteString("domain: bomb\ndescriptors:\n  - key: l0\n    descriptors: &l0\n")
	b.WriteString("      - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}\n")
	b.WriteString("      - {key: b, rate_limit: {unit: second, requests_per_unit: 1}}\n")
	for i := 1; i <= 24; i++ {
		fmt.Fprintf(&b, "  - key: l%d\n    descriptors: &l%d\n      - {key: a, descriptors: *l%d}\n      - {key: b, descriptors: *l%d}\n", i, i, i-1, i-1)
	}
	return b.String()
}

// TestServeSurvivesHostileRules drops hostile files into the watched rules
// directory of a running service: each is refused with its file and line,
// the rules in force stay, and the service keeps answering.
func TestServeSurvivesHostileRules(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), rulesFile(5))
	p := startTollgate(t, "serve", "--config", dir)
	if got := rulesLimitOf(p); got != 5 {
		t.Fatalf("limit %d, want 5", got)
	}
	tests := []struct {
		name, file, body string
		log              string // what the refusal logs
	}{
		{"alias bomb", "bomb.yaml", hostileAliasBomb(), `rules not loaded; the previous rules stay in force.*bomb.yaml:\d+:\d+: alias \*l\d+ expands past the limit`},
		{"recursive alias", "loop.yaml", "domain: loop\ndescriptors: &d\n  - key: k\n    descriptors: *d\n", `rules not loaded; the previous rules stay in force.*loop.yaml:4:18: alias \*d expands past the limit`},
		{"huge file", "huge.yaml", "domain: huge\n# " + strings.Repeat("x", 2<<20) + "\n", `rules not loaded; the previous rules stay in force.*huge.yaml: the file is larger than the limit of 1048576 bytes`},
	}
	for _, tc := range tests {
		file := filepath.Join(dir, tc.file)
		writeFile(t, file, tc.body)
		p.log.waitFor(t, regexp.MustCompile(tc.log), 30*time.Second)
		if got := rulesLimitOf(p); got != 5 {
			t.Errorf("%s: limit %d after the refusal, want 5 (the rules in force)", tc.name, got)
		}
		if code, _ := p.get("/readyz"); code != 200 {
			t.Errorf("%s: /readyz %d, want 200", tc.name, code)
		}
		if err := os.Remove(file); err != nil {
			t.Fatal(err)
		}
	}
	// Once the hostile files are gone, a good change is picked up again.
	writeFile(t, filepath.Join(dir, "rules.yaml"), rulesFile(6))
	awaitRulesLimit(t, p, 6, nil)
}

// TestServeFollowsReplacedRules replaces the rules directory of a running
// service several times in a row, as a ConfigMap update and as a
// deployment tool that renames the directory away do, and wants every
// change seen without SIGHUP.
func TestServeFollowsReplacedRules(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, file, config string }{
		{"configmap volume", "rules.yaml", "."},
		{"configmap file", "rules.yaml", "rules.yaml"},
		{"configmap subdirectory", "rules/rules.yaml", "rules"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cm := &testkit.ConfigMap{Dir: t.TempDir()}
			cm.Update(t, map[string]string{tc.file: rulesFile(1)})
			p := startTollgate(t, "serve", "--config", filepath.Join(cm.Dir, tc.config))
			awaitRulesLimit(t, p, 2, func() { cm.Update(t, map[string]string{tc.file: rulesFile(2)}) })
			for limit := uint32(3); limit <= 6; limit++ {
				cm.Update(t, map[string]string{tc.file: rulesFile(int(limit))})
				awaitRulesLimit(t, p, limit, nil)
			}
		})
	}
	t.Run("directory recreated", func(t *testing.T) {
		t.Parallel()
		parent := t.TempDir()
		dir := filepath.Join(parent, "rules")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "rules.yaml")
		writeFile(t, path, rulesFile(1))
		p := startTollgate(t, "serve", "--config", dir)
		awaitRulesLimit(t, p, 2, func() { writeFile(t, path, rulesFile(2)) })
		for limit := 3; limit <= 8; limit += 2 {
			old := filepath.Join(parent, fmt.Sprintf("rules.old%d", limit))
			if err := os.Rename(dir, old); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			writeFile(t, path, rulesFile(limit))
			awaitRulesLimit(t, p, uint32(limit), nil)
			if err := os.RemoveAll(old); err != nil {
				t.Fatal(err)
			}
			writeFile(t, path, rulesFile(limit+1))
			awaitRulesLimit(t, p, uint32(limit+1), nil)
		}
	})
}
