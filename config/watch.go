package config

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Watch calls changed whenever something may have changed the rules at
// path — a file written, created, removed or renamed — until ctx ends. It
// watches the directory (for a file, the directory holding it), so editors
// that save by renaming and Kubernetes ConfigMap volumes, which swap a
// symlink, are both seen. Bursts of events are folded into one call after
// a quiet period of debounce (100 ms when 0). changed runs on Watch's
// goroutine; it should load the rules with Load, compare them with Rules.Same
// and swap them in. Watch returns when ctx ends, or at once with an error
// when the watch cannot be set up.
func Watch(ctx context.Context, path string, debounce time.Duration, changed func()) error {
	if debounce <= 0 {
		debounce = 100 * time.Millisecond
	}
	dir := path
	if fi, err := os.Stat(path); err != nil {
		return fmt.Errorf("config: watch: %w", err)
	} else if !fi.IsDir() {
		dir = filepath.Dir(path)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("config: watch: %w", err)
	}
	defer w.Close()
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("config: watch %s: %w", dir, err)
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if ev.Op == fsnotify.Chmod {
				continue
			}
			timer.Reset(debounce)
		case _, ok := <-w.Errors:
			if !ok {
				return nil
			}
			// An overflow loses events: reload to be safe.
			timer.Reset(debounce)
		case <-timer.C:
			changed()
		}
	}
}
