package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// listFiles returns the files to load at path, sorted: path itself when it
// is a file, else those of the directory that o picks (see WithRuntimeTree
// and WithDotFiles), refusing more than MaxFiles of them. It reads
// directories in batches and keeps only the names it will load.
func listFiles(path string, o options) ([]string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if !fi.IsDir() {
		return []string{path}, nil
	}
	l := lister{o: o, root: path}
	if err := l.dir(path, 0); err != nil {
		return nil, err
	}
	if len(l.files) == 0 {
		if o.tree {
			return nil, fmt.Errorf("config: %s holds no file", path)
		}
		return nil, fmt.Errorf("config: %s holds no .yaml or .yml file", path)
	}
	slices.Sort(l.files)
	return l.files, nil
}

// maxTreeDepth bounds how deep WithRuntimeTree goes under a directory.
const maxTreeDepth = 16

// lister collects the files of a directory.
type lister struct {
	o     options
	root  string
	files []string
	dirs  int // directories walked under root
}

// dir adds the files of dir, depth levels under the root. The walk is
// bounded: at most maxTreeDepth levels, and MaxFiles directories as well
// as MaxFiles files.
func (l *lister) dir(dir string, depth int) error {
	if depth > maxTreeDepth {
		return fmt.Errorf("config: %s: directories nested deeper than %d levels under %s", dir, maxTreeDepth, l.root)
	}
	if depth > 0 {
		if l.dirs++; l.dirs > l.o.limits.MaxFiles {
			return fmt.Errorf("config: %s holds more than the limit of %d directories", l.root, l.o.limits.MaxFiles)
		}
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	defer d.Close()
	for {
		entries, err := d.ReadDir(256)
		for _, e := range entries {
			if err := l.entry(dir, e, depth); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("config: %w", err)
		}
	}
}

// entry adds e, an entry of dir, if it is a file to load, or the files
// under it if it is a directory to walk.
func (l *lister) entry(dir string, e os.DirEntry, depth int) error {
	name := e.Name()
	if !l.o.dotFiles && strings.HasPrefix(name, ".") {
		return nil
	}
	f := filepath.Join(dir, name)
	if e.IsDir() { // a directory itself, not a symlink to one
		if l.o.tree {
			return l.dir(f, depth+1)
		}
		return nil
	}
	if !l.o.tree && !hasRulesExt(name) {
		return nil
	}
	if e.Type()&os.ModeSymlink != 0 {
		// Followed to a file; a dangling symlink, or one to a directory,
		// is skipped (goruntime fails to read it and goes on).
		if st, err := os.Stat(f); err != nil || st.IsDir() {
			return nil
		}
	}
	if len(l.files) == l.o.limits.MaxFiles {
		what := ".yaml and .yml files"
		if l.o.tree {
			what = "files"
		}
		return fmt.Errorf("config: %s holds more than the limit of %d %s", l.root, l.o.limits.MaxFiles, what)
	}
	l.files = append(l.files, f)
	return nil
}
