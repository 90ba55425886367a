package testkit

import (
	"context"
	"log/slog"
	"sync"
)

// Logs is a slog.Handler that keeps every record, for tests that check
// what was logged: slog.New(logs) is the logger to pass. It is safe for
// concurrent use.
type Logs struct {
	mu   sync.Mutex
	recs []slog.Record
}

// Records returns a copy of the records kept so far, oldest first.
func (l *Logs) Records() []slog.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]slog.Record(nil), l.recs...)
}

// Enabled reports true: every level is kept.
func (l *Logs) Enabled(context.Context, slog.Level) bool { return true }

// Handle keeps a copy of rec.
func (l *Logs) Handle(_ context.Context, rec slog.Record) error {
	l.mu.Lock()
	l.recs = append(l.recs, rec.Clone())
	l.mu.Unlock()
	return nil
}

// WithAttrs returns l: attributes added to a logger are not kept.
func (l *Logs) WithAttrs([]slog.Attr) slog.Handler { return l }

// WithGroup returns l: groups are not kept.
func (l *Logs) WithGroup(string) slog.Handler { return l }

// Attrs returns each record kept so far as a map of its attributes' keys to
// their values, with the message under "msg", oldest first.
func (l *Logs) Attrs() []map[string]string {
	var out []map[string]string
	for _, r := range l.Records() {
		m := map[string]string{"msg": r.Message}
		r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
		out = append(out, m)
	}
	return out
}
