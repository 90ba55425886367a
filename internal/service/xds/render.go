package xds

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tollgate/tollgate/internal/service/config"
)

// A pushed RateLimitConfig becomes a rules file: the rules file that says
// what the resource says, key for key, as envoyproxy/ratelimit turns the
// resource into its own file structure before loading it. The file then
// goes through config.ParseSources, the loader of files, so that a pushed
// config meets every check and every bound a file meets (size, number,
// depth, descriptors, lengths): there is one validation, not two that
// could drift.
//
// The file is written in YAML's flow style (JSON with Go-quoted strings,
// whose escapes YAML reads alike), one descriptor a line: line n of a
// message about it is the resource's (n-1)th descriptor, counted depth
// first. It holds no anchor nor alias, and writing stops as soon as it
// passes the size limit, so that a hostile resource costs no more to
// refuse than the bytes it came in.

// TypeURL is the type of the resources asked for: one RateLimitConfig
// per domain, as Envoy Gateway pushes them.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// units are the names of RateLimitUnit's numbers. 5 to 7 are those of the
// schema's later versions (MONTH, YEAR, WEEK), which the version of the
// module tollgate builds with does not name yet: a management server built
// with a later one is read right.
var units = [...]string{"UNKNOWN", "SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR", "WEEK"}

// sources turns the resources of one response into rules files, each at
// most max bytes written (one that is more is cut just past max, for the
// loader to refuse by its size). A resource that is no RateLimitConfig is
// an error.
func sources(resources []*anypb.Any, max int64) ([]config.Source, error) {
	out := make([]config.Source, len(resources))
	for i, a := range resources {
		if a.GetTypeUrl() != TypeURL {
			return nil, fmt.Errorf("xds: resource %d is a %s, not a RateLimitConfig", i, a.GetTypeUrl())
		}
		var c rlsconf.RateLimitConfig
		if err := anypb.UnmarshalTo(a, &c, proto.UnmarshalOptions{}); err != nil {
			return nil, fmt.Errorf("xds: resource %d: %w", i, err)
		}
		name := c.GetName()
		if name == "" {
			name = c.GetDomain()
		}
		if name == "" {
			name = fmt.Sprintf("resource %d", i)
		}
		out[i] = config.Source{Name: name, Data: render(&c, max)}
	}
	return out, nil
}

// render writes c as a rules file of at most about max bytes.
func render(c *rlsconf.RateLimitConfig, max int64) []byte {
	w := writer{max: int(min(max, 1<<30))} // within an int on 32-bit platforms too
	w.raw(`{"domain": `)
	w.str(c.GetDomain())
	if ds := c.GetDescriptors(); len(ds) > 0 {
		w.raw(`, "descriptors": [`)
		w.descriptors(ds)
		w.raw("]")
	}
	w.raw("}\n")
	return w.b
}

// writer appends to b until it holds more than max bytes, then ignores
// what follows.
type writer struct {
	b   []byte
	max int
}

func (w *writer) full() bool { return len(w.b) > w.max }

func (w *writer) raw(s string) {
	if !w.full() {
		w.b = append(w.b, s...)
	}
}

// str writes s quoted; a string that would take the file past max is
// cut there instead, the file to be refused for its size.
func (w *writer) str(s string) {
	switch {
	case w.full():
	case len(w.b)+len(s) > w.max:
		w.b = append(w.b, s[:w.max+1-len(w.b)]...)
	default:
		w.b = strconv.AppendQuote(w.b, s)
	}
}

func (w *writer) uint(n uint32) {
	if !w.full() {
		w.b = strconv.AppendUint(w.b, uint64(n), 10)
	}
}

// descriptors writes a list of descriptors, each on a line of its own.
// It recurses once per level: how deep a resource can nest is bounded
// before, by the protobuf decoder (10,000 levels), and the file it makes
// is refused past config.Limits.MaxDepth.
func (w *writer) descriptors(ds []*rlsconf.RateLimitDescriptor) {
	for i, d := range ds {
		if w.full() {
			return
		}
		if i > 0 {
			w.raw(",")
		}
		w.raw("\n{\"key\": ")
		w.str(d.GetKey())
		if v := d.GetValue(); v != "" {
			w.raw(`, "value": `)
			w.str(v)
		}
		if p := d.GetRateLimit(); p != nil {
			w.raw(`, "rate_limit": `)
			w.policy(p)
		}
		if d.GetShadowMode() {
			w.raw(`, "shadow_mode": true`)
		}
		if d.GetDetailedMetric() {
			w.raw(`, "detailed_metric": true`)
		}
		if quotaMode(d) {
			w.raw(`, "quota_mode": true`)
		}
		switch m, ok := descriptorMetadata(d); {
		case !ok: // for the loader to refuse, saying why
			w.raw(`, "metadata": "unreadable: no google.protobuf.Struct"`)
		case m != nil:
			w.raw(`, "metadata": `)
			w.value(structpb.NewStructValue(m))
		}
		if cs := d.GetDescriptors(); len(cs) > 0 {
			w.raw(`, "descriptors": [`)
			w.descriptors(cs)
			w.raw("]")
		}
		w.raw("}")
	}
}

// policy writes a rate_limit as envoyproxy/ratelimit reads the resource's:
// a limited one always has a unit and requests_per_unit (proto3 cannot
// tell 0 from unset, and 0 denies every request), UNKNOWN included, which
// the loader refuses; an unlimited one has its unit only when it names
// one, which the loader refuses too, and never requests_per_unit, which
// envoy ignores there.
func (w *writer) policy(p *rlsconf.RateLimitPolicy) {
	w.raw("{")
	sep := ""
	field := func(name string) {
		w.raw(sep + `"` + name + `": `)
		sep = ", "
	}
	unit := int(p.GetUnit())
	if p.GetUnlimited() {
		field("unlimited")
		w.raw("true")
	}
	if !p.GetUnlimited() || unit != 0 {
		field("unit")
		if unit >= 0 && unit < len(units) {
			w.str(units[unit])
		} else {
			w.str(strconv.Itoa(unit))
		}
	}
	if !p.GetUnlimited() {
		field("requests_per_unit")
		w.uint(p.GetRequestsPerUnit())
	}
	if n := p.GetName(); n != "" {
		field("name")
		w.str(n)
	}
	if rs := p.GetReplaces(); len(rs) > 0 {
		field("replaces")
		w.raw("[")
		for i, r := range rs {
			if i > 0 {
				w.raw(", ")
			}
			w.raw(`{"name": `)
			w.str(r.GetName())
			w.raw("}")
		}
		w.raw("]")
	}
	w.raw("}")
}

// fileLimit is the largest file under l.
func fileLimit(l config.Limits) int64 {
	if l.MaxFileSize > 0 {
		return l.MaxFileSize
	}
	return config.DefaultLimits().MaxFileSize
}

// value writes a metadata value in YAML's flow style, on the line of its
// descriptor, a mapping's keys in order so that one resource always makes
// one file. A number that is no JSON number (NaN, ±Inf) is written as its
// text, as the loader would read it from a file. It recurses once per
// level, bounded as descriptors are (see descriptors); the loader refuses
// metadata nested past config.Limits.MaxDepth.
func (w *writer) value(v *structpb.Value) {
	if w.full() {
		return
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StructValue:
		fields := k.StructValue.GetFields()
		w.raw("{")
		for i, name := range slices.Sorted(maps.Keys(fields)) {
			if i > 0 {
				w.raw(", ")
			}
			w.str(name)
			w.raw(": ")
			w.value(fields[name])
		}
		w.raw("}")
	case *structpb.Value_ListValue:
		w.raw("[")
		for i, e := range k.ListValue.GetValues() {
			if i > 0 {
				w.raw(", ")
			}
			w.value(e)
		}
		w.raw("]")
	case *structpb.Value_StringValue:
		w.str(k.StringValue)
	case *structpb.Value_BoolValue:
		w.raw(strconv.FormatBool(k.BoolValue))
	case *structpb.Value_NumberValue:
		n := k.NumberValue
		if math.IsNaN(n) || math.IsInf(n, 0) {
			w.str(strconv.FormatFloat(n, 'g', -1, 64))
		} else {
			w.raw(strconv.FormatFloat(n, 'g', -1, 64))
		}
	default: // null, or no kind
		w.raw("null")
	}
}

// quotaModeField is quota_mode's number in later versions of the schema
// than the module's tollgate builds with, which keeps it among a
// descriptor's unknown fields.
const quotaModeField = 7

// metadataField is metadata's number in later versions of the schema, a
// google.protobuf.Struct kept among a descriptor's unknown fields by the
// module's version tollgate builds with.
const metadataField = 8

// descriptorMetadata reads metadata from d's unknown fields: as protobuf
// has it for a message field, every occurrence merged into one. It is nil
// when there is none, and reports false when it is no Struct (nested past
// protobuf's 10,000 levels, say).
func descriptorMetadata(d *rlsconf.RateLimitDescriptor) (*structpb.Struct, bool) {
	var m *structpb.Struct
	b := d.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		if num == metadataField && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, false
			}
			if m == nil {
				m = &structpb.Struct{}
			}
			if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(v, m); err != nil {
				return nil, false
			}
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
	}
	return m, true
}

// quotaMode reads quota_mode from d's unknown fields: the last value wins,
// as protobuf has it.
func quotaMode(d *rlsconf.RateLimitDescriptor) bool {
	on := false
	b := d.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		if num == quotaModeField && typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return false
			}
			on = v != 0
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return false
		}
		b = b[m:]
	}
	return on
}
