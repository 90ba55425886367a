package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/tollgate/tollgate"
)

// builder turns the YAML documents of the rules files into Rules: a tree of
// descriptors per domain and the list of every rule. It records each
// problem and reads on, so that one load reports every error it can (up to
// maxErrors), not only the first.
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
	// warn is WithWarnings's report, nil without it; shadows is what it
	// needs to find unreachable descriptors (warnings.go).
	warn    func(Warning)
	shadows map[shadowKey]*shadowSeen
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
		warn:    o.warn,
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
	for _, r := range b.rules.all {
		if r.Rollout != nil {
			rolled := *r // complete now: its path, flags and index
			rolled.RequestsPerUnit, rolled.Limit = r.rolledPerUnit, r.Rollout.Limit
			rolled.Rollout = nil
			r.Rolled = &rolled
		}
	}
	return b.rules, nil
}

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
	value         bool // a value, or a pattern other than only '*'s
	shared        string
	valueToMetric bool
}

var descriptorKeys = []string{"key", "value", "rate_limit", "rate_limits", "descriptors", "shadow_mode", "quota_mode",
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
	concurrency, metadata                              *yaml.Node
	// rateLimits is the rate_limits list, setKey its key.
	rateLimits, setKey                                *yaml.Node
	dryRun, quota, detailed, toMetric, shareThreshold bool
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
		case "rate_limits":
			e.setKey, e.rateLimits = kn, v
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
			e.metadata = v
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
	lv := level{step: step, value: strings.Trim(e.value, "*") != "", valueToMetric: e.toMetric && e.value == ""}
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
	case e.rateLimits != nil && e.rateLimit != nil:
		b.errorf(e.setKey, "a descriptor takes rate_limit or rate_limits, not both (%s): put every limit in rate_limits", id)
	case e.rateLimits != nil && e.concurrency != nil:
		b.errorf(e.setKey, "a descriptor takes rate_limits or a concurrency limit, not both (%s)", id)
	case e.concurrency != nil:
		n.rule = b.concurrency(e.concurrency, domain, id, path)
	case e.rateLimits != nil:
		n.rule = b.rateLimits(e.rateLimits, domain, id, path)
	case e.rateLimit != nil:
		n.rule = b.rateLimit(e.rateLimit, domain, id, path)
	}
	if n.rule != nil {
		n.rule.DryRun, n.rule.QuotaMode, n.rule.DetailedMetric = e.dryRun, e.quota, e.detailed
		n.rule.Line = e.keyNode.Line
		if e.metadata != nil {
			n.rule.Metadata = b.metadata(e.metadata)
		}
	}
	if b.warn != nil {
		b.shadowWarnings(parent, e, id)
	}
	if e.children != nil {
		b.descriptors(n, e.children, domain, id, path)
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
