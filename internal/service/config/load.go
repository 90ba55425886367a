package config

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// Error is one problem in a file, located to its line and column.
type Error struct {
	File   string
	Line   int
	Column int
	Msg    string
}

// Error formats e as "file:line:column: message".
func (e *Error) Error() string {
	if e.Line == 0 {
		return e.File + ": " + e.Msg
	}
	return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Column, e.Msg)
}

// maxErrors bounds how many errors one load reports: enough to fix a file
// in one go, not a wall of text for a binary fed by mistake.
const maxErrors = 20

// Load reads the rules in path: one YAML file, or every *.yaml and *.yml
// file directly in a directory (names starting with '.' are skipped, which
// suits Kubernetes ConfigMap volumes). WithRuntimeTree picks a directory's
// files as envoyproxy/ratelimit does instead, and WithDotFiles reads names
// starting with '.' too. Every file is parsed and validated; on any error
// Load returns nil and an error listing up to 20 problems, each with its
// file, line and column. Files over the limits (see Limits) are errors
// too: Load never reads more than MaxFileSize bytes of a file, nor
// anything but regular files (or symlinks to them).
func Load(path string, opts ...Option) (*Rules, error) {
	o := newOptions(opts)
	files, err := listFiles(path, o)
	if err != nil {
		return nil, err
	}
	b := newBuilder(o)
	var total int64
	for _, f := range files {
		data, err := readFile(f, o.limits.MaxFileSize)
		if err != nil {
			return nil, err
		}
		if total += int64(len(data)); total > o.limits.MaxTotalSize {
			return nil, fmt.Errorf("config: %s: the files of %s add up to more than the limit of %d bytes", f, path, o.limits.MaxTotalSize)
		}
		b.file(f, data)
	}
	return b.finish()
}

// Parse reads the rules in one file's contents; name is used in errors.
func Parse(name string, data []byte, opts ...Option) (*Rules, error) {
	o := newOptions(opts)
	if int64(len(data)) > o.limits.MaxFileSize {
		return nil, fmt.Errorf("config: %s: the file is larger than the limit of %d bytes", name, o.limits.MaxFileSize)
	}
	b := newBuilder(o)
	b.file(name, data)
	return b.finish()
}

// Source is the contents of one rules file that did not come from a
// file: one resource pushed by an xDS management server, say. Name plays
// the part of the file's name, in errors and in Rules.Files.
type Source struct {
	Name string
	Data []byte
}

// ParseSources reads the rules in sources as Load reads a directory of
// files, each source a file, under the same limits: at most MaxFiles
// sources, each at most MaxFileSize bytes and all together at most
// MaxTotalSize, each parsed and validated as a file is. Names must be
// unique and not empty. No source at all is no rules, not an error: a
// management server may well push an empty set.
func ParseSources(sources []Source, opts ...Option) (*Rules, error) {
	o := newOptions(opts)
	if len(sources) > o.limits.MaxFiles {
		return nil, fmt.Errorf("config: %d sources, more than the limit of %d", len(sources), o.limits.MaxFiles)
	}
	seen := make(map[string]bool, len(sources))
	var total int64
	for _, s := range sources {
		switch {
		case s.Name == "":
			return nil, errors.New("config: a source without a name")
		case seen[s.Name]:
			return nil, fmt.Errorf("config: %s: a second source of this name", s.Name)
		case int64(len(s.Data)) > o.limits.MaxFileSize:
			return nil, fmt.Errorf("config: %s: larger than the limit of %d bytes", s.Name, o.limits.MaxFileSize)
		}
		seen[s.Name] = true
		if total += int64(len(s.Data)); total > o.limits.MaxTotalSize {
			return nil, fmt.Errorf("config: %s: the sources add up to more than the limit of %d bytes", s.Name, o.limits.MaxTotalSize)
		}
	}
	b := newBuilder(o)
	for _, s := range sources {
		b.file(s.Name, s.Data)
	}
	return b.finish()
}

// readFile reads a regular file of at most max bytes. It checks the kind
// before opening, so that a FIFO or a device named *.yaml cannot block or
// flood the loader, and reads no more than max+1 bytes whatever the file
// claims to hold.
func readFile(name string, max int64) ([]byte, error) {
	fi, err := os.Stat(name)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("config: %s: not a regular file", name)
	}
	if fi.Size() > max {
		return nil, fmt.Errorf("config: %s: the file is larger than the limit of %d bytes", name, max)
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("config: %s: %w", name, err)
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("config: %s: the file is larger than the limit of %d bytes", name, max)
	}
	return data, nil
}

// LoadError is what Load and Parse return for invalid files: every *Error
// found, in order.
type LoadError struct {
	Errors []error
	msg    string
}

// Error lists every problem, one per line.
func (e *LoadError) Error() string { return e.msg }

// Unwrap returns the *Error values, for errors.As.
func (e *LoadError) Unwrap() []error { return e.Errors }
