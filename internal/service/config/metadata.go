package config

import (
	"math"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// A descriptor's metadata is any mapping, which envoyproxy/ratelimit
// returns in the response's dynamic metadata when the descriptor's rule
// passes (RESPONSE_DYNAMIC_METADATA): Envoy's access logs and later filters
// read it. It becomes a protobuf Struct once, when the rules are loaded, as
// envoy converts it: YAML's integers and floats are numbers, true and false
// booleans, null null, every other scalar (a date, say) its text, and keys
// the text they are written as. It lies within the file's bounds (size,
// nodes, scalar bytes, aliases) and, since Envoy's protobuf parser nests
// at most 100 levels, within MaxDepth levels of nesting.

// metadata converts a descriptor's metadata n, reporting why when it is no
// mapping, nests deeper than MaxDepth or repeats a key. Empty metadata,
// or null, is none (nil), as in envoy.
func (b *builder) metadata(n *yaml.Node) *structpb.Struct {
	n = deref(n)
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		b.errorf(n, "metadata must be a mapping, found %s", kindName(n))
		return nil
	}
	v, ok := b.metadataValue(n, 1)
	if !ok || len(v.GetStructValue().GetFields()) == 0 {
		return nil
	}
	return v.GetStructValue()
}

// metadataValue converts n, at depth levels of nesting, or reports why it
// cannot.
func (b *builder) metadataValue(n *yaml.Node, depth int) (*structpb.Value, bool) {
	n = deref(n)
	if depth > b.limits.MaxDepth && (n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode) {
		b.errorf(n, "metadata nested deeper than %d levels (the limit)", b.limits.MaxDepth)
		return nil, false
	}
	switch n.Kind {
	case yaml.MappingNode:
		fields := make(map[string]*structpb.Value, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := deref(n.Content[i])
			if k.Kind != yaml.ScalarNode {
				b.errorf(k, "a metadata key must be a scalar, found %s", kindName(k))
				return nil, false
			}
			if _, dup := fields[k.Value]; dup {
				b.errorf(k, "metadata key %q repeated", k.Value)
				return nil, false
			}
			v, ok := b.metadataValue(n.Content[i+1], depth+1)
			if !ok {
				return nil, false
			}
			fields[k.Value] = v
		}
		return structpb.NewStructValue(&structpb.Struct{Fields: fields}), true
	case yaml.SequenceNode:
		list := make([]*structpb.Value, len(n.Content))
		for i, c := range n.Content {
			v, ok := b.metadataValue(c, depth+1)
			if !ok {
				return nil, false
			}
			list[i] = v
		}
		return structpb.NewListValue(&structpb.ListValue{Values: list}), true
	}
	return scalarValue(n), true
}

// scalarValue is the value of a YAML scalar, by its resolved tag.
func scalarValue(n *yaml.Node) *structpb.Value {
	switch n.Tag {
	case "!!null":
		return structpb.NewNullValue()
	case "!!bool":
		var x bool
		if n.Decode(&x) == nil {
			return structpb.NewBoolValue(x)
		}
	case "!!int":
		var x int64
		if n.Decode(&x) == nil {
			return structpb.NewNumberValue(float64(x))
		}
		var u uint64
		if n.Decode(&u) == nil {
			return structpb.NewNumberValue(float64(u))
		}
	case "!!float":
		var x float64
		if n.Decode(&x) == nil && !math.IsNaN(x) && !math.IsInf(x, 0) {
			return structpb.NewNumberValue(x)
		}
		// NaN and the infinities have no JSON form (/json answers in
		// JSON): their text, as an integer past 64 bits.
	}
	return structpb.NewStringValue(n.Value)
}
