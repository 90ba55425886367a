package redisstore

import "testing"

func TestParseReply(t *testing.T) {
	const at = int64(1_700_000_000_000_000)
	for _, tc := range []struct {
		name  string
		reply any
		ok    bool
	}{
		{"valid", []any{int64(1), int64(4), int64(0), int64(500), int64(0), at}, true},
		{"not an array", "OK", false},
		{"nil", nil, false},
		{"short", []any{int64(1), int64(4)}, false},
		{"no time", []any{int64(1), int64(4), int64(0), int64(500), int64(0)}, false},
		{"long", []any{int64(1), int64(4), int64(0), int64(500), int64(0), at, int64(0)}, false},
		{"string element", []any{int64(1), "4", int64(0), int64(500), int64(0), at}, false},
		{"allowed is 2", []any{int64(2), int64(4), int64(0), int64(500), int64(0), at}, false},
		{"negative", []any{int64(1), int64(-4), int64(0), int64(500), int64(0), at}, false},
		{"negative time", []any{int64(1), int64(4), int64(0), int64(500), int64(0), int64(-1)}, false},
		{"time past 2250", []any{int64(1), int64(4), int64(0), int64(500), int64(0), int64(1) << 53}, false},
	} {
		_, err := parseReply(tc.reply)
		if got, want := err == nil, tc.ok; got != want {
			t.Errorf("%s: ok = %v, want %v (err %v)", tc.name, got, want, err)
		}
	}
}
