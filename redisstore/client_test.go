package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/redisstore"
)

// TestNewClient decides through a client made from the test server's URL,
// and refuses URLs it cannot make a client of, saying so without the
// password.
func TestNewClient(t *testing.T) {
	t.Parallel()
	c, err := redisstore.NewClient(server.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := redisstore.New(c, redisstore.WithPrefix(testkit.KeyPrefix(t)))
	if res, err := s.AllowN(ctx, "k", tollgate.PerMinute(1), 1); err != nil || !res.Allowed {
		t.Fatalf("AllowN through NewClient: %+v, %v", res, err)
	}
	for _, tc := range []struct{ url, want string }{
		{"127.0.0.1:6379", "no scheme"},
		{"http://:hunter2@127.0.0.1", `scheme "http"`},
		{"redis+sentinel://:hunter2@127.0.0.1:26379", "master_name"},
		{"redis://:hunter2@127.0.0.1:port", "redisstore: redis URL"},
	} {
		c, err := redisstore.NewClient(tc.url)
		if err == nil {
			c.Close()
			t.Errorf("NewClient(%q): no error", tc.url)
			continue
		}
		if got := err.Error(); !strings.HasPrefix(got, "redisstore: ") || !strings.Contains(got, tc.want) || strings.Contains(got, "hunter2") {
			t.Errorf("NewClient(%q): %q, want a redisstore error about %q, without the password", tc.url, got, tc.want)
		}
	}
}
