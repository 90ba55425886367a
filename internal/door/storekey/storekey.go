// Package storekey turns namespaced keys into store keys the same way for
// every door: the middleware's rules (package enforce) and the decision
// service (internal/service).
package storekey

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/tollgate/tollgate"
)

// String turns b — a namespaced key: a prefix of prefixLen bytes naming
// what is limited and ending in a separator (httplimit and grpclimit:
// "rule:kind:"; the decision service: "rl|"), then the value — into a
// store key. When b is longer than tollgate.MaxKeyLen the value is replaced
// by its SHA-256, so a client sending a huge header is still limited (a
// store would reject the long key, and the rule would fail open). Every
// door (httplimit, grpclimit, the decision service) hashes long keys
// here, so they all keep this promise the same way.
//
// A hashed key ends its prefix with '#' instead of the separator
// ("rule:kind#<hex>", "rl#<hex>"), so hashed and literal keys live in
// separate namespaces: a client that sends the hex of someone else's long
// value as its own value spends its own counter, not theirs. This holds
// as long as the byte before the separator can never be followed by '#'
// in a literal key: rule and kind names never contain ':', so a literal
// key always has a ':' after its kind, and a hashed key never has one
// after its rule name; the service's keys all start with "rl|" or "rl#".
func String(b []byte, prefixLen int) string { return string(Bytes(b, prefixLen)) }

// Bytes is String without the string: the store key's bytes, made in b
// (which it may extend), for a caller that lends them to a store that
// copies a key it keeps (internal/store/lentkeys).
func Bytes(b []byte, prefixLen int) []byte {
	if len(b) > tollgate.MaxKeyLen {
		sum := sha256.Sum256(b[prefixLen:])
		b = b[:prefixLen]
		b[prefixLen-1] = '#'
		b = hex.AppendEncode(b, sum[:])
	}
	return b
}

// Shadow returns the store key on which a rollout's new limit is tried in
// shadow for key (see enforce.Rollout): a state of its own, so that trying
// a limit never spends from the one in force. Penalty and Denials return
// the keys of a policy's penalty (enforce.Penalty) for key: when it ends,
// and the denials that start it.
//
// Each is key after a marker no other key starts with — '"' (Shadow), and
// `\p` and `\d`: rule names exclude '"' and '\', and the service's keys
// start with "rl" — so they never meet a door's keys or each other. A key
// too long for its marker is hashed first, after the marker and '#': a
// literal derived key never holds 64 hex digits after it with no ':'.
func Shadow(key string) string { return derived(`"`, key) }

// Penalty returns the store key of the penalty of key (see Shadow).
func Penalty(key string) string { return derived(`\p`, key) }

// Denials returns the store key counting the denials of key that start a
// penalty (see Shadow).
func Denials(key string) string { return derived(`\d`, key) }

func derived(marker, key string) string {
	if len(marker)+len(key) <= tollgate.MaxKeyLen {
		return marker + key
	}
	sum := sha256.Sum256([]byte(key))
	return marker + "#" + hex.EncodeToString(sum[:])
}
