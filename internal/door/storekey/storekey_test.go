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
	seen := map[string]string{}
	for _, key := range []string{"api:ip:10.0.0.1", "rl|edge|k=v", long, long[:tollgate.MaxKeyLen-1], long[:len(long)-1] + "w"} {
		seen[key] = "the key itself"
		for name, f := range map[string]func(string) string{"Shadow": Shadow, "Penalty": Penalty, "Denials": Denials} {
			got := f(key)
			if len(got) > tollgate.MaxKeyLen || f(key) != got {
				t.Errorf("%s(%.40q…) = %.40q…: want a stable key of at most %d bytes", name, key, got, tollgate.MaxKeyLen)
			}
			if other, dup := seen[got]; dup {
				t.Errorf("%s(%.40q…) = %.40q…, already %s", name, key, got, other)
			}
			seen[got] = name + " of " + key[:min(20, len(key))]
		}
	}
}
