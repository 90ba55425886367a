package enforce

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/tollgate/tollgate"
)

// KeyString turns b — a namespaced key: a prefix of prefixLen bytes naming
// the rule and the key's kind, then the value — into a store key. When b is
// longer than tollgate.MaxKeyLen the value is replaced by "sha256=" and its
// hash, so a client sending a huge header is still limited (a store would
// reject the long key, and the rule would fail open).
func KeyString(b []byte, prefixLen int) string {
	if len(b) > tollgate.MaxKeyLen {
		sum := sha256.Sum256(b[prefixLen:])
		b = append(b[:prefixLen], "sha256="...)
		b = hex.AppendEncode(b, sum[:])
	}
	return string(b)
}
