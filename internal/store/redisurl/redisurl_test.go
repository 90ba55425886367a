package redisurl

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tollgate/tollgate/internal/test/redistest"
)

func TestNewClient(t *testing.T) {
	t.Parallel()
	tests := []struct {
		url  string
		kind string // Go type of the client, or "" for an error
		err  string
	}{
		{"redis://127.0.0.1:6379/0", "*redis.Client", ""},
		{"rediss://user:secret@redis.example:6380", "*redis.Client", ""},
		{"redis+sentinel://127.0.0.1:26379?master_name=mymaster&addr=127.0.0.1:26380", "*redis.Client", ""},
		{"redis+cluster://127.0.0.1:7000?addr=127.0.0.1:7001", "*redis.ClusterClient", ""},
		{"redis+sentinel://127.0.0.1:26379", "", "needs the master_name parameter"},
		{"http://127.0.0.1", "", `scheme "http"`},
		{"redis+ring://127.0.0.1", "", `scheme "redis+ring"`},
		{"127.0.0.1:6379", "", "no scheme"},
		{"redis://user:secret@127.0.0.1:6379?bogus=1", "", "user:xxxxx@"},
	}
	for _, tc := range tests {
		c, err := NewClient(tc.url)
		if tc.kind == "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err %v, want one containing %q", tc.url, err, tc.err)
			}
			if err != nil && strings.Contains(err.Error(), "secret") {
				t.Errorf("%s: the error shows the password: %v", tc.url, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.url, err)
			continue
		}
		if got := typeName(c); got != tc.kind {
			t.Errorf("%s: %s, want %s", tc.url, got, tc.kind)
		}
		c.Close()
	}
}

const marker = "s3cr3t-M4RK"

// TestRedisURLErrorsHideCredentials drives every error path of the URL
// parser — ours and go-redis's — with a password holding marker, in every
// place a URL can carry one.
func TestRedisURLErrorsHideCredentials(t *testing.T) {
	t.Parallel()
	pw := marker + "%21x" // %-escaped: "s3cr3t-M4RK!x" once decoded
	for _, tc := range []struct {
		name, url string
	}{
		{"no scheme", "user:" + pw + "@127.0.0.1:6379"},
		{"no scheme, no user", ":" + pw + "@127.0.0.1:6379"},
		{"unknown scheme", "http://:" + pw + "@127.0.0.1:6379"},
		{"unknown deployment", "redis+ring://:" + pw + "@127.0.0.1:6379"},
		{"bad port", "redis://:" + pw + "@127.0.0.1:port"},
		{"bad escape in password", "redis://:" + marker + "%zz@127.0.0.1:6379"},
		{"password with a slash", "redis://:" + marker + "/x@127.0.0.1:6379/0"},
		{"password with a question mark", "redis://:" + marker + "?x@127.0.0.1:6379?dial_timeout=x"},
		{"password without a colon", "redis://" + pw + "@127.0.0.1:6379/x"},
		{"bad database", "redis://:" + pw + "@127.0.0.1:6379/abc"},
		{"bad path", "redis://:" + pw + "@127.0.0.1:6379/1/2"},
		{"bad option", "redis://:" + pw + "@127.0.0.1:6379?dial_timeout=soon"},
		{"unknown option", "redis://:" + pw + "@127.0.0.1:6379?frobnicate=1"},
		{"password option on one server", "redis://127.0.0.1:6379?password=" + pw},
		{"sentinel without master", "redis+sentinel://:" + pw + "@127.0.0.1:26379?password=" + pw},
		{"sentinel password option", "redis+sentinel://127.0.0.1:26379?master_name=m&password=" + pw + "&dial_timeout=soon"},
		{"sentinel_password option", "redis+sentinel://127.0.0.1:26379?master_name=m&sentinel_password=" + pw},
		{"sentinel bad bool", "redis+sentinel://127.0.0.1:26379?master_name=m&password=" + pw + "&replica_only=" + pw},
		{"sentinel bad addr", "redis+sentinel://:" + pw + "@127.0.0.1:26379?master_name=m&addr=" + pw},
		{"cluster bad option", "redis+cluster://:" + pw + "@127.0.0.1:7000?read_only=maybe"},
		{"cluster bad addr", "redis+cluster://u:" + pw + "@127.0.0.1:7000?addr=nohost"},
		{"cluster password option", "redis+cluster://127.0.0.1:7000?password=" + pw},
		{"tls cluster, bad number", "rediss+cluster://:" + pw + "@127.0.0.1:7000?max_redirects=" + pw},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := NewClient(tc.url)
			if err == nil {
				c.Close()
				t.Fatalf("NewClient(%q): no error", tc.url)
			}
			if got := err.Error(); strings.Contains(got, marker) || strings.Contains(got, "M4RK") {
				t.Errorf("error shows the password: %s", got)
			}
			if !strings.HasPrefix(err.Error(), "redisstore: redis URL") {
				t.Errorf("error %q: want it to start with %q", err, "redisstore: redis URL")
			}
		})
	}
}

// TestRedactor checks the spellings a credential can take in text:
// go-redis's and net/url's messages quote, escape and decode.
func TestRedactor(t *testing.T) {
	t.Parallel()
	r := NewRedactor("redis+sentinel://sentinel:"+marker+"-a%40b@h:26379?master_name=m&password="+marker+"-c&sentinel_password="+marker+"-d", marker+"-file\"q")
	for _, text := range []string{
		marker + "-a%40b", marker + "-a@b", marker + "-c", marker + "-d", marker + "-file\"q",
		strconv.Quote(marker + "-file\"q"), `parse "redis://sentinel:` + marker + `-a%40b@h": invalid port`,
	} {
		if got := r.Redact(text); strings.Contains(got, "M4RK") {
			t.Errorf("Redact(%q) = %q", text, got)
		}
	}
	if got, want := r.Redact("dial tcp 127.0.0.1:26379: connect: connection refused"), "dial tcp 127.0.0.1:26379: connect: connection refused"; got != want {
		t.Errorf("Redact changed text without secrets: %q, want %q", got, want)
	}
}

// TestRedisPasswordOption connects to a real redis-server that requires a
// password: WithPassword replaces a URL's wrong one, and a wrong
// password's error does not show it.
func TestRedisPasswordOption(t *testing.T) {
	t.Parallel()
	rdb := redistest.NewServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Set after start: redistest checks the server with a PING of its own.
	if err := rdb.Client(t).ConfigSet(ctx, "requirepass", marker+"-right").Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		url  string
		opts []Option
		ok   bool
	}{
		{"password in URL", "redis://:" + marker + "-right@" + rdb.Addr(), nil, true},
		{"option replaces the URL's", "redis://:" + marker + "-wrong@" + rdb.Addr(), []Option{WithPassword(marker + "-right")}, true},
		{"option alone", "redis://" + rdb.Addr(), []Option{WithPassword(marker + "-right")}, true},
		{"wrong option", "redis://:" + marker + "-right@" + rdb.Addr(), []Option{WithPassword(marker + "-wrong")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewClient(tc.url, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			err = c.Ping(ctx).Err()
			if got, want := err == nil, tc.ok; got != want {
				t.Fatalf("PING: %v, want success %v", err, want)
			}
			if err != nil && strings.Contains(err.Error(), marker) {
				t.Errorf("error shows the password: %v", err)
			}
		})
	}
}

func typeName(c redis.UniversalClient) string {
	switch c.(type) {
	case *redis.Client:
		return "*redis.Client"
	case *redis.ClusterClient:
		return "*redis.ClusterClient"
	}
	return "other"
}
