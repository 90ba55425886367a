package storekey

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/tollgate/tollgate"
)

func TestHashedApart(t *testing.T) {
	t.Parallel()
	prefix := "api:header=X-Api-Key:"
	long := strings.Repeat("v", tollgate.MaxKeyLen)
	sum := sha256.Sum256([]byte(long))
	h := hex.EncodeToString(sum[:])
	hashed := String([]byte(prefix+long), len(prefix))
	if got, want := hashed, "api:header=X-Api-Key#"+h; got != want {
		t.Errorf("long value keyed as %q, want %q", got, want)
	}
	for _, v := range []string{"sha256=" + h, h, "#" + h, "sha256:" + h} {
		if got := String([]byte(prefix+v), len(prefix)); got == hashed {
			t.Errorf("literal value %q spells the hashed key of a long value", v)
		}
	}
}
