package ruleset

import (
	"bytes"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// encode spells a tuple of parts as the middleware does: each part
// appended, then finished by appendPart.
func encode(dst []byte, parts []string) []byte {
	for _, p := range parts {
		start := len(dst)
		dst = append(dst, p...)
		dst = appendPart(dst, start)
	}
	return dst
}

// decode is an independent reading of the encoding, the test's oracle: if
// every key decodes back to the tuple it came from, no two tuples can
// share a key.
func decode(b []byte) ([]string, bool) {
	var parts []string
	for len(b) > 0 {
		colon := bytes.IndexByte(b, ':')
		if colon <= 0 {
			return nil, false
		}
		n, err := strconv.Atoi(string(b[:colon]))
		if err != nil || n < 0 || n > len(b)-colon-1 || (colon > 1 && b[0] == '0') {
			return nil, false
		}
		parts = append(parts, string(b[colon+1:colon+1+n]))
		b = b[colon+1+n:]
	}
	return parts, true
}

func TestAppendPart(t *testing.T) {
	t.Parallel()
	p := strings.Repeat("p", 999)
	for _, tc := range []struct {
		name  string
		parts []string
		want  string
	}{
		{"two", []string{"acme", "GET /x"}, "4:acme6:GET /x"},
		{"empty part", []string{"", "x"}, "0:1:x"},
		{"digits and colons", []string{"008:abc", "x"}, "7:008:abc1:x"},
		{"long part keeps its length", []string{p + "008:abc", "x"}, "1006:" + p + "008:abc1:x"},
		{"long part, other split", []string{p, "abc001:x"}, "999:" + p + "8:abc001:x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, want := string(encode([]byte("r:k:"), tc.parts)), "r:k:"+tc.want; got != want {
				t.Errorf("encode(%.20q) = %.60q…, want %.60q…", tc.parts, got, want)
			}
		})
	}
}

// TestappendPartUnambiguous is a property test: random tuples, rich in
// digits and ':' and with parts around the lengths where a clamped or
// fixed-width length would break, always decode back to themselves, and
// distinct tuples never share a key.
func TestAppendPartUnambiguous(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := "0123456789:0:ax"
	lengths := []int{0, 1, 3, 9, 10, 99, 100, 998, 999, 1000, 1006, 1500}
	randPart := func() string {
		n := lengths[rng.IntN(len(lengths))] + rng.IntN(3)
		b := make([]byte, n)
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(b)
	}
	seen := map[string]string{}
	for range 3000 {
		parts := make([]string, 2+rng.IntN(2))
		for i := range parts {
			parts[i] = randPart()
		}
		key := encode(nil, parts)
		got, ok := decode(key)
		if !ok || strings.Join(got, "\x00") != strings.Join(parts, "\x00") {
			t.Fatalf("key of %.40q decodes to %.40q (%v)", parts, got, ok)
		}
		id := strings.Join(parts, "\x00") + "\x00" + strconv.Itoa(len(parts))
		if prev, dup := seen[string(key)]; dup && prev != id {
			t.Fatalf("two tuples share the key %.60q", key)
		}
		seen[string(key)] = id
	}
}
