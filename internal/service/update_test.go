package service

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate/tollgate/internal/service/config"
	"github.com/tollgate/tollgate/memorystore"
)

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestUpdate swaps rules in from a source other than files, as Reload
// does: a failure keeps the rules in force and is counted every time, but
// the same failure again and again (a management server resending a
// refused config in a loop) is logged once per log interval, saying how
// many were left out.
func TestUpdate(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var log syncBuffer
	s, err := New(memorystore.New(), WithClock(func() time.Time { return now }), WithLogInterval(10*time.Second),
		WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	if err != nil {
		t.Fatal(err)
	}
	good, err := config.ParseSources([]config.Source{{Name: "a/b", Data: []byte("domain: a/b\n")}})
	if err != nil {
		t.Fatal(err)
	}
	ok := func() (*config.Rules, error) { return good, nil }
	refused := errors.New("config: a/b:3:11: invalid rate limit unit \"UNKNOWN\"")
	bad := func() (*config.Rules, error) { return nil, refused }
	count := func(r int) float64 { return testutil.ToFloat64(s.m.reloads[r]) }

	if err := s.Update("xds 127.0.0.1:1", ok); err != nil || s.Rules() != good {
		t.Fatalf("Update(good) = %v, rules %p; want nil, %p", err, s.Rules(), good)
	}
	for range 1000 {
		if err := s.Update("xds 127.0.0.1:1", bad); !errors.Is(err, refused) {
			t.Fatalf("Update(bad) = %v, want %v", err, refused)
		}
	}
	if s.Rules() != good {
		t.Error("a refused update replaced the rules in force")
	}
	if got, want := count(reloadFailure), 1000.0; got != want {
		t.Errorf("failures counted %v, want %v", got, want)
	}
	if got, want := strings.Count(log.String(), "rules not loaded"), 1; got != want {
		t.Errorf("%d failure lines for 1000 alike within the interval, want %d:\n%s", got, want, log.String())
	}
	now = now.Add(11 * time.Second)
	s.Update("xds 127.0.0.1:1", bad)
	if !strings.Contains(log.String(), "similar_events_not_logged=999") {
		t.Errorf("the next interval's line does not say 999 were left out:\n%s", log.String())
	}
	other := errors.New("config: a/b: another problem")
	s.Update("xds 127.0.0.1:1", func() (*config.Rules, error) { return nil, other })
	if !strings.Contains(log.String(), "another problem") {
		t.Errorf("a different failure was not logged at once:\n%s", log.String())
	}
	if err := s.Update("xds 127.0.0.1:1", ok); err != nil {
		t.Fatal(err)
	}
	if got, want := count(reloadUnchanged), 1.0; got != want {
		t.Errorf("unchanged counted %v, want %v", got, want)
	}
	if !strings.Contains(log.String(), `msg="rules loaded" source="xds 127.0.0.1:1"`) {
		t.Errorf("no line says where the rules came from:\n%s", log.String())
	}
}
