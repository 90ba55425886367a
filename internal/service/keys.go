package service

import (
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/tollgate/tollgate/internal/door/storekey"
	"github.com/tollgate/tollgate/internal/service/config"
)

// counterKey is the store key of a descriptor's counter:
// "rl|domain|key=value|key=value", with '|', '=' and '\' escaped by '\' so
// that no two descriptors share a key, and with a share_threshold pattern
// instead of the value where the rule has one. A key longer than the store
// accepts becomes "rl#" and the SHA-256 of what follows "rl|"
// (storekey.String, as the middleware hashes): every literal key starts
// with "rl|", so no descriptor can spell the hashed key of another.
func counterKey(domain string, entries []*rlv3.RateLimitDescriptor_Entry, r *config.Rule) string {
	var stack [256]byte
	b := append(stack[:0], "rl|"...)
	b = appendEscaped(b, domain)
	for i, e := range entries {
		b = append(b, '|')
		b = appendEscaped(b, e.GetKey())
		b = append(b, '=')
		v := e.GetValue()
		if sv, ok := r.SharedValue(i); ok {
			v = sv
		}
		b = appendEscaped(b, v)
	}
	return storekey.String(b, len("rl|"))
}

func appendEscaped(b []byte, s string) []byte {
	i := 0
	for i < len(s) && s[i] != '|' && s[i] != '=' && s[i] != '\\' {
		i++
	}
	b = append(b, s[:i]...) // all of s, for most values
	for ; i < len(s); i++ {
		switch c := s[i]; c {
		case '|', '=', '\\':
			b = append(b, '\\', c)
		default:
			b = append(b, c)
		}
	}
	return b
}
