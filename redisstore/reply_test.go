package redisstore

import "testing"

func TestParseReply(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply any
		ok    bool
	}{
		{"valid", []any{int64(1), int64(4), int64(0), int64(500), int64(0)}, true},
		{"not an array", "OK", false},
		{"nil", nil, false},
		{"short", []any{int64(1), int64(4)}, false},
		{"long", []any{int64(1), int64(4), int64(0), int64(500), int64(0), int64(0)}, false},
		{"string element", []any{int64(1), "4", int64(0), int64(500), int64(0)}, false},
		{"allowed is 2", []any{int64(2), int64(4), int64(0), int64(500), int64(0)}, false},
		{"negative", []any{int64(1), int64(-4), int64(0), int64(500), int64(0)}, false},
	} {
		_, err := parseReply(tc.reply)
		if got, want := err == nil, tc.ok; got != want {
			t.Errorf("%s: ok = %v, want %v (err %v)", tc.name, got, want, err)
		}
	}
}
