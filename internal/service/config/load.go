package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tollgate/tollgate"
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

type builder struct {
	rules   *Rules
	errs    []error
	domains map[string]string // domain → where it was defined, for duplicates
	// file-level defaults of the document being read
	name     string
	alg      *tollgate.Algorithm
	failMode FailureMode

	limits  Limits
	merge   bool      // WithMergeDomains
	exp     expansion // of the file being read
	ndesc   int       // descriptors so far, in every file
	tooMany bool      // MaxDescriptors was passed: stop reading
	// top holds where each descriptor at the top of a domain was defined,
	// by domain: with merging, the top level spans files.
	top map[string]map[kv]place
}

// place is where a descriptor was defined.
type place struct {
	file string
	line int
}

func newBuilder(o options) *builder {
	return &builder{
		rules:   &Rules{domains: map[string]*node{}, sources: map[string]string{}},
		domains: map[string]string{},
		limits:  o.limits,
		merge:   o.merge,
		top:     map[string]map[kv]place{},
	}
}

func (b *builder) errorf(n *yaml.Node, format string, args ...any) {
	if len(b.errs) >= maxErrors {
		return
	}
	e := &Error{File: b.name, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	b.errs = append(b.errs, e)
}

func (b *builder) finish() (*Rules, error) {
	if len(b.errs) > 0 {
		msgs := make([]string, len(b.errs))
		for i, e := range b.errs {
			msgs[i] = e.Error()
		}
		return nil, &LoadError{Errors: b.errs, msg: "config: " + strings.Join(msgs, "\nconfig: ")}
	}
	return b.rules, nil
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

func (b *builder) file(name string, data []byte) {
	b.name = name
	b.rules.files = append(b.rules.files, name)
	b.rules.sources[name] = string(data)
	b.exp = expansion{maxNodes: b.limits.MaxNodes, maxBytes: b.limits.MaxScalarBytes}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	docs := 0
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			b.errs = append(b.errs, &Error{File: name, Msg: strings.TrimPrefix(err.Error(), "yaml: ")})
			return
		}
		if len(doc.Content) == 0 || (doc.Content[0].Kind == yaml.ScalarNode && doc.Content[0].Tag == "!!null") {
			continue // an empty document, such as after a trailing "---"
		}
		docs++
		if !b.checkExpansion(&doc) {
			return
		}
		b.document(deref(doc.Content[0]))
	}
	if docs == 0 {
		b.errs = append(b.errs, &Error{File: name, Msg: "no domain: the file is empty"})
	}
}

var rootKeys = []string{"domain", "descriptors", "algorithm", "failure_mode"}

func (b *builder) document(root *yaml.Node) {
	b.alg, b.failMode = nil, FailDefault
	if root.Kind != yaml.MappingNode {
		b.errorf(root, "the top of a rules file must be a mapping with domain and descriptors, found %s", kindName(root))
		return
	}
	var domain string
	var domainOK = true
	var domainNode, descs *yaml.Node
	b.mapping(root, rootKeys, func(k string, key, v *yaml.Node) {
		switch k {
		case "domain":
			domain, domainOK = b.str(v)
			domainNode = v
		case "descriptors":
			descs = v
		case "algorithm":
			if s, ok := b.str(v); ok {
				a, err := tollgate.ParseAlgorithm(s)
				if err != nil {
					b.errorf(v, "unknown algorithm %q (want one of token_bucket, gcra, fixed_window, sliding_window_log, sliding_window_counter, leaky_bucket)", s)
				} else {
					b.alg = &a
				}
			}
		case "failure_mode":
			b.failMode = b.failureMode(v)
		}
	})
	if domain == "" {
		if !domainOK {
			return // already reported
		}
		if domainNode == nil {
			domainNode = root
		}
		b.errorf(domainNode, "domain is missing or empty")
		return
	}
	top := b.rules.domains[domain]
	if prev, ok := b.domains[domain]; ok && !b.merge {
		b.errorf(domainNode, "domain %q is already defined at %s", domain, prev)
		return
	} else if !ok {
		b.domains[domain] = fmt.Sprintf("%s:%d", b.name, domainNode.Line)
		top = &node{}
		b.rules.domains[domain] = top
		b.top[domain] = map[kv]place{}
	}
	if descs != nil {
		b.descriptors(top, descs, domain, domain, nil)
	}
}

// level is what a rule inherits from one descriptor on its path.
type level struct {
	step          string
	shared        string
	valueToMetric bool
}

var descriptorKeys = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode",
	"detailed_metric", "value_to_metric", "share_threshold", "metadata", "concurrency"}

func (b *builder) descriptors(parent *node, seq *yaml.Node, domain, id string, path []level) {
	if seq.Kind == yaml.ScalarNode && seq.Tag == "!!null" {
		return // "descriptors:" with nothing under it
	}
	if seq.Kind != yaml.SequenceNode {
		b.errorf(seq, "descriptors must be a list, found %s", kindName(seq))
		return
	}
	if len(path) >= b.limits.MaxDepth {
		b.errorf(seq, "descriptors nested deeper than %d levels (the limit)", b.limits.MaxDepth)
		return
	}
	seen := map[kv]place{}
	if len(path) == 0 {
		seen = b.top[domain] // the top level of a domain spans files
	}
	for _, d := range seq.Content {
		if b.tooMany {
			return
		}
		d = deref(d)
		if b.ndesc++; b.ndesc > b.limits.MaxDescriptors {
			b.tooMany = true
			b.errorf(d, "more than the limit of %d descriptors", b.limits.MaxDescriptors)
			return
		}
		e, ok := b.descriptor(d)
		if !ok {
			continue
		}
		step := e.key
		if e.value != "" {
			step += "_" + e.value
		}
		if first, dup := seen[kv{e.key, e.value}]; dup {
			at := e.keyNode
			if e.valueNode != nil {
				at = e.valueNode
			}
			where := fmt.Sprintf("line %d", first.line)
			if first.file != b.name {
				where = fmt.Sprintf("%s:%d", first.file, first.line)
			}
			b.errorf(at, "duplicate descriptor %s.%s (first at %s)", id, step, where)
			continue
		}
		seen[kv{e.key, e.value}] = place{b.name, e.keyNode.Line}
		childPath := append(slices.Clip(path), b.level(&e, id, step))
		b.addDescriptor(parent, &e, domain, id+"."+step, childPath)
	}
}

// descriptor is one entry of a descriptors list, as written.
type descriptor struct {
	key, value                                         string
	keyNode, valueNode, rateLimit, children, shareNode *yaml.Node
	concurrency                                        *yaml.Node
	dryRun, quota, detailed, toMetric, shareThreshold  bool
}

// descriptor reads the descriptor d. It reports false, having reported
// why, when d is not a mapping or has no key.
func (b *builder) descriptor(d *yaml.Node) (descriptor, bool) {
	var e descriptor
	if d.Kind != yaml.MappingNode {
		b.errorf(d, "a descriptor must be a mapping with a key, found %s", kindName(d))
		return e, false
	}
	keyOK := true
	b.mapping(d, descriptorKeys, func(k string, kn, v *yaml.Node) {
		switch k {
		case "key":
			e.key, keyOK = b.str(v)
			e.keyNode = v
		case "value":
			e.value, _ = b.str(v)
			e.valueNode = v
		case "rate_limit":
			e.rateLimit = v
		case "concurrency":
			e.concurrency = v
		case "descriptors":
			e.children = v
		case "shadow_mode":
			e.dryRun = b.boolean(v)
		case "quota_mode":
			e.quota = b.boolean(v)
		case "detailed_metric":
			e.detailed = b.boolean(v)
		case "value_to_metric":
			e.toMetric = b.boolean(v)
		case "share_threshold":
			e.shareThreshold = b.boolean(v)
			e.shareNode = v
		case "metadata":
			// Accepted for compatibility: envoyproxy/ratelimit returns it
			// as dynamic metadata when so configured; tollgate does not.
		}
	})
	if e.key == "" {
		if !keyOK {
			return e, false // already reported
		}
		at := e.keyNode
		if at == nil {
			at = d
		}
		b.errorf(at, "descriptor has no key (or an empty one)")
		return e, false
	}
	return e, true
}

// level is the step e adds to the path of the descriptors under it (and
// of its own rule), id.step in messages.
func (b *builder) level(e *descriptor, id, step string) level {
	lv := level{step: step, valueToMetric: e.toMetric && e.value == ""}
	wild := strings.Contains(e.value, "*")
	if e.shareThreshold {
		if !wild {
			b.errorf(e.shareNode, "share_threshold needs a wildcard value (containing '*'), but %s.%s has none", id, step)
		} else {
			lv.shared = e.value
		}
	}
	if wild && e.toMetric {
		// value_to_metric on a wildcard shows the request's value
		// (unless the counter is shared, when the pattern shows).
		lv.valueToMetric = !e.shareThreshold
	}
	return lv
}

// addDescriptor adds the node of e under parent, with e's rule, and the
// descriptors nested in e under that node; id names e, path leads to it.
func (b *builder) addDescriptor(parent *node, e *descriptor, domain, id string, path []level) {
	n := &node{}
	if e.value == "" {
		if parent.bare == nil {
			parent.bare = map[string]*node{}
		}
		parent.bare[e.key] = n
	} else {
		if parent.exact == nil {
			parent.exact = map[kv]*node{}
		}
		parent.exact[kv{e.key, e.value}] = n
		if strings.Contains(e.value, "*") {
			parent.wild = append(parent.wild, wildcard{key: e.key, parts: strings.Split(e.value, "*"), node: n})
		}
	}
	switch {
	case e.rateLimit != nil && e.concurrency != nil:
		b.errorf(e.concurrency, "a descriptor takes a rate_limit or a concurrency limit, not both (%s)", id)
	case e.concurrency != nil:
		n.rule = b.concurrency(e.concurrency, domain, id, path)
	case e.rateLimit != nil:
		n.rule = b.rateLimit(e.rateLimit, domain, id, path)
	}
	if n.rule != nil {
		n.rule.DryRun, n.rule.QuotaMode, n.rule.DetailedMetric = e.dryRun, e.quota, e.detailed
		n.rule.Line = e.keyNode.Line
	}
	if e.children != nil {
		b.descriptors(n, e.children, domain, id, path)
	}
}

var rateLimitKeys = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces",
	"algorithm", "burst", "failure_mode", "cost"}

func (b *builder) rateLimit(m *yaml.Node, domain, id string, path []level) *Rule {
	if m.Kind != yaml.MappingNode {
		b.errorf(m, "rate_limit must be a mapping with unit and requests_per_unit, found %s", kindName(m))
		return nil
	}
	nerr := len(b.errs)
	r := &Rule{Domain: domain, ID: id, File: b.name, Cost: 1, FailureMode: b.failMode, depth: len(path)}
	f := b.rateLimitFields(m, r)
	if f.replNode != nil {
		r.Replaces = b.replaces(f.replNode, r.Name)
	}
	b.checkUnlimited(m, r, &f)
	if !r.Unlimited {
		r.Limit = tollgate.Limit{Algorithm: f.alg, Rate: int(r.RequestsPerUnit), Period: r.Unit.Duration()}
	}
	// An unlimited rule never reaches the store, and one of
	// requests_per_unit 0 denies without asking it: no limit to check.
	if len(b.errs) == nerr && !r.Unlimited && r.RequestsPerUnit != 0 {
		b.checkLimit(m, r, &f)
	}
	b.finishRule(r, path)
	if len(b.errs) > nerr {
		return nil
	}
	return r
}

var concurrencyKeys = []string{"max_in_flight", "lease", "name", "failure_mode"}

// concurrency reads a concurrency mapping: a rule that bounds how many
// requests are in flight at once rather than how often they come.
func (b *builder) concurrency(m *yaml.Node, domain, id string, path []level) *Rule {
	if m.Kind != yaml.MappingNode {
		b.errorf(m, "concurrency must be a mapping with max_in_flight and lease, found %s", kindName(m))
		return nil
	}
	nerr := len(b.errs)
	r := &Rule{Domain: domain, ID: id, File: b.name, Cost: 1, FailureMode: b.failMode, depth: len(path),
		Concurrency: &Concurrency{}}
	var maxNode, leaseNode *yaml.Node
	b.mapping(m, concurrencyKeys, func(k string, kn, v *yaml.Node) {
		switch k {
		case "max_in_flight":
			maxNode = kn
			if x, ok := b.uint(v, 1<<53); ok {
				if x < 1 || x > tollgate.MaxConcurrency {
					b.errorf(v, "max_in_flight must be 1 to %d, got %d", tollgate.MaxConcurrency, x)
				}
				r.Concurrency.Max = int(min(x, tollgate.MaxConcurrency))
			}
		case "lease":
			leaseNode = kn
			r.Concurrency.Lease = b.lease(v)
		case "name":
			r.Name, _ = b.str(v)
		case "failure_mode":
			r.FailureMode = b.failureMode(v)
		}
	})
	if maxNode == nil {
		b.errorf(m, "concurrency needs max_in_flight: how many requests may be in flight at once (1 to %d)", tollgate.MaxConcurrency)
	}
	if leaseNode == nil {
		b.errorf(m, "concurrency needs a lease: how long a slot stays taken when its release never comes, such as 5m (%v to %v)", tollgate.MinLease, tollgate.MaxLease)
	}
	b.finishRule(r, path)
	if len(b.errs) > nerr {
		return nil
	}
	return r
}

// lease reads a concurrency lease: a Go duration ("90s", "5m") from
// tollgate.MinLease to tollgate.MaxLease.
func (b *builder) lease(v *yaml.Node) time.Duration {
	s, ok := b.str(v)
	if !ok {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		b.errorf(v, "lease %q is not a duration (write it as 30s, 5m or 1h30m)", s)
		return 0
	}
	if _, err := tollgate.CheckLease(d); err != nil {
		b.errorf(v, "lease %v: a lease must be %v to %v", d, tollgate.MinLease, tollgate.MaxLease)
		return 0
	}
	return d
}

// rateLimitFields is what a rate_limit mapping says beyond the fields of
// its Rule: the nodes of its keys (for messages), the algorithm and burst.
type rateLimitFields struct {
	unitNode, rpuNode, algNode, burstNode, costNode, replNode *yaml.Node
	alg                                                       tollgate.Algorithm
	burst                                                     int
}

// rateLimitFields reads the rate_limit mapping m into r and the fields
// returned.
func (b *builder) rateLimitFields(m *yaml.Node, r *Rule) rateLimitFields {
	f := rateLimitFields{alg: tollgate.FixedWindow}
	if b.alg != nil {
		f.alg = *b.alg
	}
	b.mapping(m, rateLimitKeys, func(k string, kn, v *yaml.Node) {
		switch k {
		case "unit":
			f.unitNode = kn
			if u, ok := b.unit(v); ok {
				r.Unit = u
			}
		case "requests_per_unit":
			f.rpuNode = kn
			if x, ok := b.uint(v, 1<<32-1); ok {
				r.RequestsPerUnit = uint32(x)
			}
		case "unlimited":
			r.Unlimited = b.boolean(v)
		case "name":
			r.Name, _ = b.str(v)
		case "replaces":
			f.replNode = v
		case "algorithm":
			f.algNode = kn
			if a, ok := b.algorithm(v); ok {
				f.alg = a
			}
		case "burst":
			f.burstNode = kn
			if x, ok := b.atLeastOne(v, "burst"); ok {
				f.burst = x
			}
		case "failure_mode":
			r.FailureMode = b.failureMode(v)
		case "cost":
			f.costNode = v
			if x, ok := b.atLeastOne(v, "cost"); ok {
				r.Cost = x
			}
		}
	})
	return f
}

// unit reads a rate limit unit; it reports false when v is no string.
func (b *builder) unit(v *yaml.Node) (Unit, bool) {
	s, ok := b.str(v)
	if !ok {
		return 0, false
	}
	u, err := ParseUnit(s)
	if err != nil {
		b.errorf(v, "invalid rate limit unit %q (want second, minute, hour, day, week, month or year)", s)
	}
	return u, true
}

// algorithm reads an algorithm's name; it reports false when v is no
// string.
func (b *builder) algorithm(v *yaml.Node) (tollgate.Algorithm, bool) {
	s, ok := b.str(v)
	if !ok {
		return 0, false
	}
	a, err := tollgate.ParseAlgorithm(s)
	if err != nil {
		b.errorf(v, "unknown algorithm %q (want one of token_bucket, gcra, fixed_window, sliding_window_log, sliding_window_counter, leaky_bucket)", s)
	}
	return a, true
}

// atLeastOne reads a count of at least 1 (what names it in messages); it
// reports false when v is no number in range.
func (b *builder) atLeastOne(v *yaml.Node, what string) (int, bool) {
	x, ok := b.uint(v, 1<<53)
	if !ok {
		return 0, false
	}
	if x == 0 {
		b.errorf(v, "%s must be at least 1", what)
	}
	return int(x), true
}

// checkUnlimited checks that an unlimited rate_limit m has no unit,
// algorithm, burst or cost, and that any other has a unit and
// requests_per_unit.
func (b *builder) checkUnlimited(m *yaml.Node, r *Rule, f *rateLimitFields) {
	if r.Unlimited {
		if f.unitNode != nil {
			b.errorf(f.unitNode, "should not specify rate limit unit when unlimited")
		}
		for _, n := range []*yaml.Node{f.algNode, f.burstNode, f.costNode} {
			if n != nil {
				b.errorf(n, "an unlimited rate_limit takes no algorithm, burst or cost")
			}
		}
		return
	}
	if f.unitNode == nil {
		b.errorf(m, "rate_limit needs a unit (second, minute, hour, day, week, month or year), or unlimited: true")
	}
	if f.rpuNode == nil {
		b.errorf(m, "rate_limit needs requests_per_unit (0 denies every request)")
	}
}

// checkLimit sets the burst of r's limit and checks the limit, and that
// r's cost fits in it.
func (b *builder) checkLimit(m *yaml.Node, r *Rule, f *rateLimitFields) {
	switch f.alg {
	case tollgate.TokenBucket, tollgate.GCRA, tollgate.LeakyBucket:
		r.Limit.Burst = r.Limit.Rate
		if f.burst > 0 {
			r.Limit.Burst = f.burst
		}
	default:
		if f.burstNode != nil {
			b.errorf(f.burstNode, "burst applies to token_bucket, gcra and leaky_bucket, not to %s (a window admits requests_per_unit per window)", f.alg)
		}
	}
	if err := r.Limit.Validate(); err != nil {
		b.errorf(m, "%s", strings.TrimPrefix(err.Error(), "tollgate: "))
	} else if c := r.Limit.Capacity(); r.Cost > c {
		b.errorf(f.costNode, "cost %d is more than %s can ever admit at once (%d)", r.Cost, r.Limit, c)
	}
}

func (b *builder) finishRule(r *Rule, path []level) {
	r.steps = make([]string, len(path))
	for i, lv := range path {
		r.steps[i] = lv.step
		if lv.shared != "" {
			if r.shared == nil {
				r.shared = make([]string, len(path))
			}
			r.shared[i] = lv.shared
		}
		if lv.valueToMetric {
			if r.valueToMetric == nil {
				r.valueToMetric = make([]bool, len(path))
			}
			r.valueToMetric[i] = true
		}
	}
	r.Index = len(b.rules.all)
	b.rules.all = append(b.rules.all, r)
}

func (b *builder) replaces(seq *yaml.Node, own string) []string {
	if seq.Kind != yaml.SequenceNode {
		b.errorf(seq, "replaces must be a list of {name: ...}, found %s", kindName(seq))
		return nil
	}
	var names []string
	for _, e := range seq.Content {
		e = deref(e)
		if e.Kind != yaml.MappingNode {
			b.errorf(e, "a replaces entry must be a mapping with a name, found %s", kindName(e))
			continue
		}
		var name string
		b.mapping(e, []string{"name"}, func(_ string, _, v *yaml.Node) { name, _ = b.str(v) })
		switch {
		case name == "":
			b.errorf(e, "should not have an empty replaces entry")
		case name == own:
			b.errorf(e, "replaces should not contain name of same descriptor (%q)", own)
		default:
			names = append(names, name)
		}
	}
	return names
}

// mapping calls f for each key of m, rejecting unknown and repeated keys.
func (b *builder) mapping(m *yaml.Node, allowed []string, f func(k string, key, value *yaml.Node)) {
	seen := map[string]int{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], deref(m.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			b.errorf(k, "a key must be a string, found %s", kindName(k))
			continue
		}
		if !slices.Contains(allowed, k.Value) {
			hint := ""
			if s := closest(k.Value, allowed); s != "" {
				hint = fmt.Sprintf(" (did you mean %q?)", s)
			}
			b.errorf(k, "unknown key %q%s; allowed here: %s", k.Value, hint, strings.Join(allowed, ", "))
			continue
		}
		if line, dup := seen[k.Value]; dup {
			b.errorf(k, "key %q repeated (first at line %d)", k.Value, line)
			continue
		}
		seen[k.Value] = k.Line
		f(k.Value, k, v)
	}
}

func (b *builder) str(v *yaml.Node) (string, bool) {
	if v.Kind != yaml.ScalarNode {
		b.errorf(v, "want a string, found %s", kindName(v))
		return "", false
	}
	if v.Tag == "!!null" {
		return "", true
	}
	if len(v.Value) > b.limits.MaxValueLen {
		b.errorf(v, "%d bytes, more than the limit of %d for a domain, key, value or name", len(v.Value), b.limits.MaxValueLen)
		return "", false
	}
	return v.Value, true
}

// deref returns what an alias names, and any other node as it is. The
// walk through aliases is bounded by checkExpansion, which runs first.
func deref(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		return n.Alias
	}
	return n
}

func (b *builder) boolean(v *yaml.Node) bool {
	var x bool
	if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" || v.Decode(&x) != nil {
		b.errorf(v, "want true or false, found %s", describe(v))
	}
	return x
}

func (b *builder) uint(v *yaml.Node, max uint64) (uint64, bool) {
	if v.Kind == yaml.ScalarNode && v.Tag == "!!int" {
		x, err := strconv.ParseUint(strings.ReplaceAll(v.Value, "_", ""), 0, 64)
		if err == nil && x <= max {
			return x, true
		}
	}
	b.errorf(v, "want a whole number from 0 to %d, found %s", max, describe(v))
	return 0, false
}

func (b *builder) failureMode(v *yaml.Node) FailureMode {
	s, ok := b.str(v)
	if !ok {
		return FailDefault
	}
	switch s {
	case "open":
		return FailOpen
	case "closed":
		return FailClosed
	}
	b.errorf(v, "failure_mode must be open or closed, found %q", s)
	return FailDefault
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	return describe(n)
}

func describe(n *yaml.Node) string {
	if n.Kind != yaml.ScalarNode {
		return kindName(n)
	}
	if n.Tag == "!!null" {
		return "nothing"
	}
	return strconv.Quote(n.Value)
}

// closest returns the allowed key nearest to k by edit distance, when it is
// close enough to be a likely typo.
func closest(k string, allowed []string) string {
	best, bestD := "", 4
	for _, a := range allowed {
		if d := distance(k, a); d < bestD {
			best, bestD = a, d
		}
	}
	return best
}

func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
