package config

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Watch calls changed whenever something may have changed the rules at
// path — a file written, created, removed or renamed — until ctx ends.
// Bursts of events are folded into one call after a quiet period of
// debounce (100 ms when 0), or at the latest 10 × debounce after the
// burst began, so that a directory written without pause is still
// reloaded. changed runs on Watch's goroutine; it should
// load the rules with Load, compare them with Rules.Same and swap them in.
// Watch returns when ctx ends, or at once with an error when the watch
// cannot be set up.
//
// Watch follows path through replacement. It watches the directory that
// path resolves to (for a file, the directory holding it), the directory
// above path, and the directories that symlinked rules files point into;
// after every burst of events, before calling changed, it resolves path
// again and moves its watches to what path names now. So these are all
// seen, every time, not only the first:
//   - an editor saving by writing a new file and renaming it over the old;
//   - a Kubernetes ConfigMap update, which writes a new timestamped
//     directory, renames a ..data symlink to it and removes the old one,
//     whether path is the volume, a file in it, or a directory in it;
//   - the watched directory renamed away (or removed) and a new one made
//     in its place.
//
// While path does not exist, Watch waits for it to appear again (changed
// is called, and its Load fails, so the rules in force stay).
func Watch(ctx context.Context, path string, debounce time.Duration, changed func()) error {
	if debounce <= 0 {
		debounce = 100 * time.Millisecond
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("config: watch: %w", err)
	}
	if _, err := os.Stat(abs); err != nil {
		return fmt.Errorf("config: watch: %w", err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("config: watch: %w", err)
	}
	defer w.Close()
	ws := &watchSet{w: w, path: abs, dirs: map[string]watchedDir{}}
	if err := ws.sync(); err != nil {
		return err
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var burst time.Time // when the first event not yet acted on came; zero if none
	wake := func() {
		now := time.Now()
		if burst.IsZero() {
			burst = now
		}
		timer.Reset(min(debounce, max(burst.Add(10*debounce).Sub(now), 0)))
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if ev.Op == fsnotify.Chmod || !ws.relevant(ev.Name) {
				continue
			}
			wake()
		case _, ok := <-w.Errors:
			if !ok {
				return nil
			}
			// An overflow loses events: reload to be safe.
			wake()
		case <-timer.C:
			burst = time.Time{}
			// Best effort: a directory that cannot be watched now is tried
			// again after the next event, and the one above path is
			// watched whatever happens below it.
			_ = ws.sync()
			changed()
		}
	}
}

// watchSet is the set of directories watched for one path.
type watchSet struct {
	w    *fsnotify.Watcher
	path string // absolute
	dirs map[string]watchedDir
}

// watchedDir is one watched directory: the directory it was when watched
// (to notice one replaced under the same name), and, for the directory
// above path, the only names in it that matter.
type watchedDir struct {
	fi   os.FileInfo
	only map[string]bool // nil: every event matters
}

// relevant reports whether an event on name may change the rules.
func (ws *watchSet) relevant(name string) bool {
	d, ok := ws.dirs[filepath.Dir(name)]
	return !ok || d.only == nil || d.only[filepath.Base(name)]
}

// maxWatchedDirs bounds the directories one path can make Watch follow.
const maxWatchedDirs = 64

// wanted returns the directories to watch for ws.path as it resolves now.
func (ws *watchSet) wanted() map[string]map[string]bool {
	want := map[string]map[string]bool{}
	full := func(dir string) {
		if len(want) < maxWatchedDirs {
			want[dir] = nil
		}
	}
	real, err := filepath.EvalSymlinks(ws.path)
	var fi os.FileInfo
	if err == nil {
		fi, err = os.Stat(real)
	}
	switch {
	case err != nil:
		// Gone for now: only the directory above, for its return.
	case !fi.IsDir():
		// A file: its directory, where editors rename and ConfigMaps swap.
		full(filepath.Dir(ws.path))
		full(filepath.Dir(real))
	default:
		full(real)
		// Rules files that are symlinks (a ConfigMap volume's are) change
		// where they point to.
		entries, _ := os.ReadDir(real)
		for _, e := range entries {
			if e.Type()&os.ModeSymlink == 0 || !isRulesFile(e.Name()) {
				continue
			}
			if t, err := filepath.EvalSymlinks(filepath.Join(real, e.Name())); err == nil {
				full(filepath.Dir(t))
			}
		}
	}
	// The nearest existing directory above path, for path being renamed,
	// removed, recreated or its symlinks swapped. Only the names on the
	// way to path matter there: path's own, and those its symlinks pass
	// through (a ConfigMap's ..data and timestamped directories).
	above := filepath.Dir(ws.path)
	for {
		if st, err := os.Stat(above); err == nil && st.IsDir() {
			break
		}
		up := filepath.Dir(above)
		if up == above {
			break
		}
		above = up
	}
	if _, ok := want[above]; !ok {
		want[above] = ws.namesUnder(above, real)
	}
	return want
}

// namesUnder returns the names in dir that resolving ws.path goes through.
func (ws *watchSet) namesUnder(dir, real string) map[string]bool {
	names := map[string]bool{}
	add := func(p string) {
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return
		}
		// The first element; ".." means p is not under dir ("..data" is).
		if first := strings.Split(rel, string(filepath.Separator))[0]; first != "." && first != ".." {
			names[first] = true
		}
	}
	add(ws.path)
	if real != "" {
		add(real)
	}
	// Each hop of a symlink at path, such as rules -> ..data/rules.
	p := ws.path
	for range 40 {
		t, err := os.Readlink(p)
		if err != nil {
			break
		}
		if !filepath.IsAbs(t) {
			t = filepath.Join(filepath.Dir(p), t)
		}
		add(t)
		p = t
	}
	return names
}

// sync moves the watches to what ws.path resolves to now. It re-adds a
// directory replaced under the same name, and one whose watch the kernel
// dropped (a watched directory that is moved loses its watch).
func (ws *watchSet) sync() error {
	want := ws.wanted()
	active := map[string]bool{}
	for _, p := range ws.w.WatchList() {
		active[p] = true
	}
	for dir := range ws.dirs {
		if _, ok := want[dir]; !ok {
			_ = ws.w.Remove(dir) // fails for a directory already gone
			delete(ws.dirs, dir)
		}
	}
	var firstErr error
	for dir, only := range want {
		fi, err := os.Stat(dir)
		if err != nil {
			continue
		}
		if d, ok := ws.dirs[dir]; ok && active[dir] && os.SameFile(d.fi, fi) {
			d.only = only
			ws.dirs[dir] = d
			continue
		}
		_ = ws.w.Remove(dir)
		if err := ws.w.Add(dir); err != nil {
			delete(ws.dirs, dir)
			if firstErr == nil {
				firstErr = fmt.Errorf("config: watch %s: %w", dir, err)
			}
			continue
		}
		ws.dirs[dir] = watchedDir{fi: fi, only: only}
	}
	return firstErr
}

// isRulesFile reports whether Load reads a file of this name in a
// directory, by default.
func isRulesFile(name string) bool {
	return !strings.HasPrefix(name, ".") && hasRulesExt(name)
}

// hasRulesExt reports whether name ends in .yaml or .yml.
func hasRulesExt(name string) bool {
	return strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")
}
