package xds

import (
	"maps"
	"strings"
	"testing"
	"time"
)

// TestParseHeaders reads envoy's name:value,name:value and wants no error
// to show a value, which is a credential as a rule.
func TestParseHeaders(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want map[string]string
		err  string
	}{
		{"", nil, ""},
		{"Authorization:Bearer s3cret,x-tenant:t1", map[string]string{"authorization": "Bearer s3cret", "x-tenant": "t1"}, ""},
		{"authorization:Bearer a:s3cret", nil, "header entry 1 is not name:value with one colon"},
		{"x-tenant:t1,s3cret", nil, "header entry 2 is not name:value with one colon"},
		{"bad name:s3cret", nil, `"bad name" is not a header name`},
		{"grpc-timeout:s3cret", nil, `"grpc-timeout" is not a header name`},
		{"authorization:s3cret\x7f", nil, "header authorization: the value holds a byte that is not printable ASCII"},
	}
	for _, tc := range tests {
		got, err := ParseHeaders(tc.in)
		if tc.err == "" {
			if err != nil || !maps.Equal(got, tc.want) {
				t.Errorf("ParseHeaders(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("ParseHeaders(%q) = %v, want an error containing %q", tc.in, err, tc.err)
		} else if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ParseHeaders(%q): the error %q shows the value", tc.in, err)
		}
	}
}

func TestParseNodeMetadata(t *testing.T) {
	t.Parallel()
	md, ignored := ParseNodeMetadata("cluster=eg,zone:a,url=http://x?a=b,=v")
	if want := map[string]string{"cluster": "eg", "url": "http://x?a=b", "": "v"}; !maps.Equal(md, want) {
		t.Errorf("metadata %v, want %v", md, want)
	}
	if got, want := strings.Join(ignored, ","), "zone:a"; got != want {
		t.Errorf("ignored %q, want %q", got, want)
	}
}

// TestBackoff wants the waits to double from the initial one up to the
// most, spread within ±RandomFactor with jitter.
func TestBackoff(t *testing.T) {
	t.Parallel()
	b := Backoff{Initial: 10 * time.Second, Max: 60 * time.Second, RandomFactor: 0.5}
	for n, want := range map[int]time.Duration{1: 10 * time.Second, 2: 20 * time.Second, 3: 40 * time.Second, 4: 60 * time.Second, 100: 60 * time.Second} {
		if got := b.wait(n, 0.99); got != want {
			t.Errorf("wait(%d) without jitter = %v, want %v", n, got, want)
		}
	}
	b.Jitter = true
	for _, tc := range []struct {
		n    int
		rnd  float64
		want time.Duration
	}{{1, 0, 5 * time.Second}, {1, 0.5, 10 * time.Second}, {1, 0.999999, 15 * time.Second}, {3, 0, 20 * time.Second}, {4, 0.999999, 60 * time.Second}} {
		if got := b.wait(tc.n, tc.rnd); (got - tc.want).Abs() > time.Millisecond {
			t.Errorf("wait(%d, %v) = %v, want %v", tc.n, tc.rnd, got, tc.want)
		}
	}
}
