package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/store/redisurl"
)

// redisTarget is where the Redis store is and how to sign in to it, from
// the flags and the environment.
type redisTarget struct {
	url      string // "" for the memory store
	password string
	// hasPassword: password replaces the URL's.
	hasPassword bool
	// fromArgv: the URL on the command line carries a password, which
	// every local user can read with ps.
	fromArgv bool
	redact   *redisurl.Redactor
	tls      []redisurl.Option // the TLS flags', set after resolveRedis
}

// options returns the options redisurl.NewClient needs for the target.
func (r redisTarget) options() []redisurl.Option {
	if !r.hasPassword {
		return r.tls
	}
	return append([]redisurl.Option{redisurl.WithPassword(r.password)}, r.tls...)
}

// resolveRedis finds the Redis URL and password. Flags win over the
// environment, and a password given on its own wins over one inside a URL
// from the same level:
//
//	URL:      --redis, else $REDIS_URL, else the memory store
//	password: --redis-password-file, else the --redis URL's own,
//	          else $REDIS_AUTH, else the $REDIS_URL URL's own
func resolveRedis(flagURL, passwordFile string, getenv env) (redisTarget, error) {
	var t redisTarget
	t.url = flagURL
	fromFlag := flagURL != ""
	if !fromFlag {
		t.url = getenv("REDIS_URL")
	}
	switch {
	case passwordFile != "":
		pw, err := readPasswordFile(passwordFile)
		if err != nil {
			return redisTarget{}, err
		}
		t.password, t.hasPassword = pw, true
	case fromFlag && urlHasPassword(t.url):
		// the URL's own
	case getenv("REDIS_AUTH") != "":
		t.password, t.hasPassword = getenv("REDIS_AUTH"), true
	}
	if t.url == "" && passwordFile != "" {
		return redisTarget{}, errors.New("--redis-password-file needs a Redis URL: --redis or $REDIS_URL")
	}
	t.fromArgv = fromFlag && urlHasPassword(t.url)
	if t.hasPassword {
		t.redact = redisurl.NewRedactor(t.url, t.password)
	} else {
		t.redact = redisurl.NewRedactor(t.url)
	}
	return t, nil
}

// readPasswordFile reads a password from the first line of a file, as
// container secrets and systemd credentials provide it; the file's content
// never appears in an error.
func readPasswordFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("--redis-password-file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 4<<10+1))
	if err != nil {
		return "", fmt.Errorf("--redis-password-file: %w", err)
	}
	if len(b) > 4<<10 {
		return "", fmt.Errorf("--redis-password-file %s: longer than 4 KiB; want the password alone", path)
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	pw := strings.TrimSuffix(string(line), "\r")
	if pw == "" {
		return "", fmt.Errorf("--redis-password-file %s: the first line is empty; want the password", path)
	}
	return pw, nil
}

// urlHasPassword reports whether a Redis URL carries the data servers'
// password: in its user information, or for Sentinel in its password
// option.
func urlHasPassword(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		// Unreadable: redisurl.NewClient will say so; assume the worst for
		// the argv warning.
		return strings.Contains(raw, "@")
	}
	if strings.HasSuffix(u.Scheme, "+sentinel") {
		return u.Query().Get("password") != ""
	}
	_, has := u.User.Password()
	return has
}

// redisLogger passes go-redis's own log lines (dial failures, pool
// trouble) to the service's logger, so they take --log-format and
// --log-level like every other line, at most one per --log-interval like
// the failure logs — a Redis outage under load would otherwise write one
// line per connection attempt — and without credentials.
type redisLogger struct {
	log    *slog.Logger
	redact *redisurl.Redactor
	sample engine.Sampler
}

func newRedisLogger(log *slog.Logger, redact *redisurl.Redactor, every time.Duration) *redisLogger {
	return &redisLogger{log: log, redact: redact, sample: engine.Sampler{Every: every}}
}

// Printf implements go-redis's Logging interface.
func (l *redisLogger) Printf(ctx context.Context, format string, v ...any) {
	if !l.log.Enabled(ctx, slog.LevelWarn) {
		return
	}
	ok, skipped := l.sample.Allow(time.Now())
	if !ok {
		return
	}
	msg := strings.TrimSpace(l.redact.Redact(fmt.Sprintf(format, v...)))
	l.log.LogAttrs(ctx, slog.LevelWarn, "redis client", slog.String("detail", msg), engine.Skipped(skipped))
}
