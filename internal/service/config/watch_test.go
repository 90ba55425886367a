package config_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/service/config"
	"github.com/tollgate/tollgate/internal/test/testkit"
)

// versionFile is a rules file whose domain names its version.
func versionFile(v int) string {
	return fmt.Sprintf("domain: v%d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", v, v)
}

// watchRules runs Watch on path with a callback that loads the rules as a
// server does, and returns a channel of what each load found: the domain,
// or the error.
func watchRules(t *testing.T, path string) <-chan string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	loads := make(chan string, 100)
	done := make(chan error, 1)
	go func() {
		done <- config.Watch(ctx, path, 20*time.Millisecond, func() {
			r, err := config.Load(path)
			if err != nil {
				loads <- err.Error()
				return
			}
			loads <- strings.Join(r.DomainNames(), ",")
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch returned %v", err)
		}
	})
	return loads
}

// awaitLoad waits until a load finds want. retry, when not nil, is called
// every 200ms meanwhile: the first change must be repeated until the
// watch, set up asynchronously, is in place.
func awaitLoad(t *testing.T, loads <-chan string, want string, retry func()) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var seen []string
	for {
		select {
		case got := <-loads:
			if got == want {
				return
			}
			seen = append(seen, got)
		case <-tick.C:
			if retry != nil {
				retry()
			}
		case <-deadline:
			t.Fatalf("no load found %q within 10s; loads seen: %q", want, seen)
		}
	}
}

// TestWatchFollowsReplacement replaces the watched rules in the ways
// deployments do and wants every change after each replacement seen, not
// only the first.
func TestWatchFollowsReplacement(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// files are the ConfigMap's entries; path is what is watched,
		// relative to the volume.
		files func(v int) map[string]string
		path  string
	}{
		{"configmap volume", func(v int) map[string]string { return map[string]string{"rules.yaml": versionFile(v)} }, "."},
		{"configmap file", func(v int) map[string]string { return map[string]string{"rules.yaml": versionFile(v)} }, "rules.yaml"},
		{"configmap subdirectory", func(v int) map[string]string { return map[string]string{"rules/rules.yaml": versionFile(v)} }, "rules"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cm := &testkit.ConfigMap{Dir: t.TempDir()}
			cm.Update(t, tc.files(1))
			loads := watchRules(t, filepath.Join(cm.Dir, tc.path))
			v := 2
			awaitLoad(t, loads, "v2", func() { cm.Update(t, tc.files(v)) })
			for v = 3; v <= 7; v++ {
				cm.Update(t, tc.files(v))
				awaitLoad(t, loads, fmt.Sprintf("v%d", v), nil)
			}
		})
	}

	// The watched directory itself renamed away and a new one made in its
	// place, as some deployment tools do: edits to the new one count.
	t.Run("directory recreated", func(t *testing.T) {
		t.Parallel()
		parent := t.TempDir()
		dir := filepath.Join(parent, "rules")
		write := func(v int) {
			t.Helper()
			tmp := filepath.Join(dir, ".rules.yaml.tmp")
			if err := os.WriteFile(tmp, []byte(versionFile(v)), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, filepath.Join(dir, "rules.yaml")); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		write(1)
		loads := watchRules(t, dir)
		awaitLoad(t, loads, "v2", func() { write(2) })
		for v := 3; v <= 8; v += 2 {
			old := filepath.Join(parent, fmt.Sprintf("rules.old%d", v))
			if err := os.Rename(dir, old); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			write(v)
			awaitLoad(t, loads, fmt.Sprintf("v%d", v), nil)
			if err := os.RemoveAll(old); err != nil {
				t.Fatal(err)
			}
			write(v + 1)
			awaitLoad(t, loads, fmt.Sprintf("v%d", v+1), nil)
		}
	})
}

// TestWatchUnderConstantWrites writes the rules without pause, faster than
// the quiet period Watch waits for, and wants them reloaded meanwhile
// rather than only once the writes stop.
func TestWatchUnderConstantWrites(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, []byte(versionFile(1)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changed := make(chan struct{}, 1)
	go config.Watch(ctx, path, 300*time.Millisecond, func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	})
	// A write every 2ms for up to 15s never leaves the 300ms of quiet
	// that ends a burst: only the cap on a burst's length reloads.
	deadline := time.Now().Add(15 * time.Second)
	for v := 2; ; v++ {
		if err := os.WriteFile(path, []byte(versionFile(v)), 0o644); err != nil {
			t.Fatal(err)
		}
		select {
		case <-changed:
			return
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no reload within 15s of writes without pause")
		}
	}
}
