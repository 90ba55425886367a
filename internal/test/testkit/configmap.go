package testkit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// ConfigMap lays out the directory Dir the way the kubelet writes a
// ConfigMap volume: the data in a timestamped directory, a symlink ..data
// to it, and each top-level entry a symlink through ..data. A watcher of
// such a directory never sees a file change in place: every update swaps
// the whole tree under its symlinks, which is what tests of rule reloading
// need to exercise.
type ConfigMap struct {
	Dir string // the volume's mount point, an existing directory
	gen int
}

// Update replaces the volume's data with files (paths relative to Dir,
// '/'-separated) atomically, as the kubelet does: a new timestamped
// directory, a symlink ..data_tmp to it renamed over ..data, links for new
// top-level entries, and the old directory removed.
func (c *ConfigMap) Update(tb testing.TB, files map[string]string) {
	tb.Helper()
	c.gen++
	ts := fmt.Sprintf("..2026_12_01_05_00_00.%09d", c.gen)
	for name, body := range files {
		p := filepath.Join(c.Dir, ts, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	old, _ := os.Readlink(filepath.Join(c.Dir, "..data"))
	tmp := filepath.Join(c.Dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.Dir, "..data")); err != nil {
		tb.Fatal(err)
	}
	for name := range files {
		top := strings.Split(name, "/")[0]
		link := filepath.Join(c.Dir, top)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", top), link); err != nil {
			tb.Fatal(err)
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(c.Dir, old)); err != nil {
			tb.Fatal(err)
		}
	}
}
