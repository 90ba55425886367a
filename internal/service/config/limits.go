package config

import (
	"fmt"

	"go.yaml.in/yaml/v3"
)

// Limits bounds what a rules file, or a directory of them, can make Load
// do. A file over a limit is an error naming the file (and, inside the
// file, the line) like any other invalid file, so a reload with it keeps
// the rules in force. A zero field takes its default; see DefaultLimits.
//
// The defaults are far above what a hand-written or generated
// envoyproxy/ratelimit file needs (a Kubernetes ConfigMap holds at most
// 1 MiB), and low enough that a hostile file costs little to refuse: an
// alias bomb is stopped after MaxNodes steps, without allocating; the most
// a file can cost is the YAML parser's own work on a file of MaxFileSize,
// about 130 MB allocated and a quarter of a second for 1 MiB of nothing
// but one-character list items, given back once the file is refused.
type Limits struct {
	// MaxFileSize is the largest file, in bytes. Default 1 MiB.
	MaxFileSize int64
	// MaxTotalSize is the largest sum of the files of a directory, in
	// bytes. Default 8 MiB.
	MaxTotalSize int64
	// MaxFiles is the most .yaml and .yml files a directory may hold
	// (with WithRuntimeTree: the most files of any name, and the most
	// directories, under it). Default 256.
	MaxFiles int
	// MaxNodes is the most YAML nodes (each key, value, list and mapping)
	// one file may hold once its aliases are expanded: an alias counts as
	// a full copy of what it names, every time it is used. This is what
	// stops a few hundred bytes of nested aliases ("billion laughs") from
	// expanding into millions of rules. Default 250,000: rules written in
	// the style of envoyproxy/ratelimit's examples take 8 to 20 bytes a
	// node, so a file of MaxFileSize holds 55,000 to 130,000 of them.
	MaxNodes int
	// MaxScalarBytes is the most bytes of text (keys, values, names) one
	// file may hold once its aliases are expanded, counted like MaxNodes:
	// it stops a long value from being copied through aliases. Default
	// 4 MiB.
	MaxScalarBytes int
	// MaxDepth is how deep descriptors may nest: a descriptor at the top
	// of a domain is at depth 1. Default 16.
	MaxDepth int
	// MaxDescriptors is the most descriptors all the files together may
	// define (every rule is on one); a descriptor with rate_limits counts
	// once for each of its limits. Default 100,000.
	MaxDescriptors int
	// MaxValueLen is the longest domain, key, value or name, in bytes.
	// Default 1024.
	MaxValueLen int
}

// DefaultLimits returns the limits Load applies when given no others.
func DefaultLimits() Limits {
	return Limits{
		MaxFileSize:    1 << 20,
		MaxTotalSize:   8 << 20,
		MaxFiles:       256,
		MaxNodes:       250_000,
		MaxScalarBytes: 4 << 20,
		MaxDepth:       16,
		MaxDescriptors: 100_000,
		MaxValueLen:    1024,
	}
}

// orDefault returns l with every zero (or negative) field set to its
// default.
func (l Limits) orDefault() Limits {
	d := DefaultLimits()
	set := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	set64 := func(v *int64, def int64) {
		if *v <= 0 {
			*v = def
		}
	}
	set64(&l.MaxFileSize, d.MaxFileSize)
	set64(&l.MaxTotalSize, d.MaxTotalSize)
	set(&l.MaxFiles, d.MaxFiles)
	set(&l.MaxNodes, d.MaxNodes)
	set(&l.MaxScalarBytes, d.MaxScalarBytes)
	set(&l.MaxDepth, d.MaxDepth)
	set(&l.MaxDescriptors, d.MaxDescriptors)
	set(&l.MaxValueLen, d.MaxValueLen)
	return l
}

// Option changes how Load and Parse read rules.
type Option func(*options)

type options struct {
	limits   Limits
	merge    bool
	tree     bool // WithRuntimeTree
	dotFiles bool // WithDotFiles
	warn     func(Warning)
}

// WithRuntimeTree makes Load read a directory as envoyproxy/ratelimit reads
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY (through lyft's
// goruntime): every file in it and in the directories under it, whatever
// its name (not only *.yaml, whatever envoy's README says), each as a
// rules file. A symlink to a file is read; a symlink to a directory is
// not followed. Names starting with '.', files and directories, are
// skipped, as envoyproxy/ratelimit skips them with
// RUNTIME_IGNOREDOTFILES=true; add WithDotFiles for its default, which
// reads them. Without this option Load reads only the *.yaml and *.yml
// files directly in the directory.
//
// On a Kubernetes ConfigMap volume the two choices differ: its files are
// symlinks through "..data" to a directory named "..2026_01_31_…", so
// reading dotfiles reads each file twice, once through each path, and a
// domain defined twice is refused, by envoyproxy/ratelimit as by Load.
// Watch follows the directory itself and the targets of its symlinked
// *.yaml and *.yml files, not the directories under it nor other
// symlinks' targets (goruntime does not either): after changing those,
// reload by other means (tollgate serve: SIGHUP).
func WithRuntimeTree() Option {
	return func(o *options) { o.tree = true }
}

// WithDotFiles makes Load read the files (and, with WithRuntimeTree, the
// directories) of a directory whose names start with '.', which it skips
// by default. envoyproxy/ratelimit reads them unless
// RUNTIME_IGNOREDOTFILES=true.
func WithDotFiles() Option {
	return func(o *options) { o.dotFiles = true }
}

// WithMergeDomains lets several files (or YAML documents) define one
// domain, as envoyproxy/ratelimit does with MERGE_DOMAIN_CONFIG=true: the
// descriptors at the top of each are added to the domain, in file order.
// Only the top level merges: a key (with the same value) at the top of two
// files is an error, as it is within one file, even when the descriptors
// under them differ. Wildcards keep their file order across the files, so
// that the first file's pattern is tried first. Without this option a
// domain defined twice is an error.
func WithMergeDomains() Option {
	return func(o *options) { o.merge = true }
}

// WithLimits replaces the default limits; its zero fields keep their
// defaults.
func WithLimits(l Limits) Option {
	return func(o *options) { o.limits = l.orDefault() }
}

func newOptions(opts []Option) options {
	o := options{limits: DefaultLimits()}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// expansion measures a file as the builder will walk it, following every
// alias, and stops at the first node over the budget. It allocates
// nothing, so refusing an alias bomb costs at most MaxNodes steps.
type expansion struct {
	nodes, bytes       int
	maxNodes, maxBytes int
	// alias is the outermost alias being expanded (nil outside any); on
	// failure it stays set, to point the error at the alias to remove.
	alias *yaml.Node
	over  *yaml.Node // the node at which the budget ran out
}

// walk counts n and everything under it; false means over budget.
func (e *expansion) walk(n *yaml.Node) bool {
	e.nodes++
	e.bytes += len(n.Value)
	if e.nodes > e.maxNodes || e.bytes > e.maxBytes {
		e.over = n
		return false
	}
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			return true
		}
		outer := e.alias == nil
		if outer {
			e.alias = n
		}
		if !e.walk(n.Alias) {
			return false
		}
		if outer {
			e.alias = nil
		}
		return true
	}
	for _, c := range n.Content {
		if !e.walk(c) {
			return false
		}
	}
	return true
}

// checkExpansion reports, as an error of the file, a document that would
// expand past the limits. It returns false when the document must not be
// walked any further.
func (b *builder) checkExpansion(doc *yaml.Node) bool {
	if b.exp.walk(doc) {
		return true
	}
	what := fmt.Sprintf("%d YAML nodes", b.exp.maxNodes)
	if b.exp.bytes > b.exp.maxBytes {
		what = fmt.Sprintf("%d bytes of keys and values", b.exp.maxBytes)
	}
	if a := b.exp.alias; a != nil {
		b.errorf(a, "alias *%s expands past the limit of %s in a file (each use of an alias counts as a copy of what it names)", a.Value, what)
	} else {
		b.errorf(b.exp.over, "the file holds more than the limit of %s", what)
	}
	return false
}
