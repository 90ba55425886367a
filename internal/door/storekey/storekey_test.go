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

func TestShadowApart(t *testing.T) {
	t.Parallel()
	long := "api:ip:" + strings.Repeat("v", tollgate.MaxKeyLen-7)
	for _, key := range []string{"api:ip:10.0.0.1", "rl|edge|k=v", long, long[:tollgate.MaxKeyLen-1]} {
		got := Shadow(key)
		if got == key || !strings.HasPrefix(got, `"`) || len(got) > tollgate.MaxKeyLen {
			t.Errorf("Shadow(%.40q…) = %.40q…: want a key of its own, at most %d bytes", key, got, tollgate.MaxKeyLen)
		}
		if Shadow(key) != got {
			t.Errorf("Shadow(%.40q…) is not stable", key)
		}
	}
	if a, b := Shadow(long), Shadow(long[:len(long)-1]+"w"); a == b {
		t.Errorf("two long keys share the shadow key %q", a)
	}
}
