package server

import (
	"cmp"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// RedisOption changes how NewRedisClient connects.
type RedisOption func(*redisOptions)

type redisOptions struct {
	password    string
	hasPassword bool
}

// WithRedisPassword sets the password of the Redis servers that hold the
// data, replacing the one in the URL: a password kept out of the URL need
// not appear in a command line or an environment that other users can read.
// For Sentinel it is the master's and replicas' password (the URL's password
// option), not the sentinels' own (the URL's user information).
func WithRedisPassword(password string) RedisOption {
	return func(o *redisOptions) { o.password, o.hasPassword = password, true }
}

// NewRedisClient returns a Redis client for rawURL. The forms are go-redis's
// URL forms, with the scheme saying which kind of deployment it is:
//
//	redis://[user:password@]host:6379[/db][?option=value&...]    one server
//	rediss://...                                                 one server, TLS
//	redis+sentinel://[user:password@]sentinel1:26379?master_name=mymaster&addr=sentinel2:26379&addr=sentinel3:26379[&password=...]
//	rediss+sentinel://...                                        Sentinel, TLS
//	redis+cluster://[user:password@]node1:7000?addr=node2:7001&addr=node3:7002
//	rediss+cluster://...                                         Cluster, TLS
//
// For Sentinel, the user and password in the URL are the sentinels' own;
// the master's are the username and password options (go-redis's
// convention). Options are go-redis's, in snake case (dial_timeout,
// pool_size, ...). Every client has ContextTimeoutEnabled, so the server's
// deadline bounds each call.
//
// Errors never contain a credential: the URL they quote, and go-redis's
// own messages, are passed through a Redactor first.
func NewRedisClient(rawURL string, opts ...RedisOption) (redis.UniversalClient, error) {
	var ro redisOptions
	for _, o := range opts {
		o(&ro)
	}
	var red *Redactor
	if ro.hasPassword {
		red = NewRedactor(rawURL, ro.password)
	} else {
		red = NewRedactor(rawURL)
	}
	shown := red.Redact(rawURL)
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return nil, fmt.Errorf("server: redis URL %q has no scheme (want redis://, rediss://, redis+sentinel:// or redis+cluster://)", shown)
	}
	base, kind, _ := strings.Cut(scheme, "+")
	if (base != "redis" && base != "rediss") || (kind != "" && kind != "sentinel" && kind != "cluster") {
		return nil, fmt.Errorf("server: redis URL scheme %q: want redis, rediss, redis+sentinel, rediss+sentinel, redis+cluster or rediss+cluster", red.Redact(scheme))
	}
	plain := base + "://" + rest
	// net/url's errors quote the whole URL, or a fragment of a bad
	// %-escape that may be part of a password: parse here, and say only
	// what to check.
	if _, err := url.Parse(plain); err != nil {
		return nil, fmt.Errorf("server: redis URL %s: malformed (check the host, the port and the %%-escapes of the user information and options)", shown)
	}
	// go-redis's errors are redacted and not wrapped: a caller unwrapping
	// one would find the raw text again, password and all.
	wrap := func(err error) error {
		return fmt.Errorf("server: redis URL %s: %s", shown, red.Redact(err.Error()))
	}
	switch kind {
	case "":
		o, err := redis.ParseURL(plain)
		if err != nil {
			return nil, wrap(err)
		}
		if ro.hasPassword {
			o.Password = ro.password
		}
		o.ContextTimeoutEnabled = true
		return redis.NewClient(o), nil
	case "sentinel":
		o, err := redis.ParseFailoverURL(plain)
		if err != nil {
			return nil, wrap(err)
		}
		if o.MasterName == "" {
			return nil, fmt.Errorf("server: redis URL %s: a Sentinel URL needs the master_name parameter", shown)
		}
		if ro.hasPassword {
			o.Password = ro.password
		}
		o.ContextTimeoutEnabled = true
		return redis.NewFailoverClient(o), nil
	default: // cluster
		o, err := redis.ParseClusterURL(plain)
		if err != nil {
			return nil, wrap(err)
		}
		if ro.hasPassword {
			o.Password = ro.password
		}
		o.ContextTimeoutEnabled = true
		return redis.NewClusterClient(o), nil
	}
}

// A Redactor removes credentials from text before it is shown: in error
// messages, log lines and metrics. It knows the secrets of one Redis URL —
// the password in its user information (or the whole user information when
// it has no ':', which may be a password written without one) and the value
// of every option whose name speaks of a credential (password,
// sentinel_password, ...) — plus any passwords given to it, and replaces
// every spelling of each (raw, %-decoded, %-encoded, Go-quoted) with
// "xxxxx". It reads the URL leniently, so it finds the secrets of a URL
// that no parser accepts. A nil *Redactor redacts nothing.
type Redactor struct {
	secrets []string // longest first, so a secret inside another goes too
}

// NewRedactor returns a Redactor for the credentials of rawURL and for
// passwords.
func NewRedactor(rawURL string, passwords ...string) *Redactor {
	var found []string
	_, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		rest = rawURL
	}
	// The user information ends at the last '@' of the authority; a
	// password holding '/', '?' or '#' moves that '@' past them, so both
	// readings count.
	authority := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority = rest[:i]
	}
	for _, s := range []string{authority, rest} {
		if at := strings.LastIndex(s, "@"); at >= 0 {
			user := s[:at]
			if _, pw, has := strings.Cut(user, ":"); has {
				found = append(found, pw)
			} else {
				found = append(found, user)
			}
		}
	}
	if _, query, has := strings.Cut(rest, "?"); has {
		for _, kv := range strings.FieldsFunc(query, func(r rune) bool { return r == '&' || r == ';' }) {
			k, v, _ := strings.Cut(kv, "=")
			if dk, err := url.QueryUnescape(k); err == nil {
				k = dk
			}
			if credentialOption(k) {
				found = append(found, v)
			}
		}
	}
	found = append(found, passwords...)
	r := &Redactor{}
	for _, s := range found {
		r.add(s)
	}
	slices.SortFunc(r.secrets, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	r.secrets = slices.Compact(r.secrets)
	return r
}

// credentialOption reports whether a URL option of this name carries a
// credential: go-redis's password and, for Sentinel, sentinel_password,
// and anything else named like one.
func credentialOption(name string) bool {
	name = strings.ToLower(name)
	for _, w := range []string{"pass", "secret", "token", "auth", "credential"} {
		if strings.Contains(name, w) {
			return true
		}
	}
	return false
}

// add records every spelling of secret that text about it may contain.
func (r *Redactor) add(secret string) {
	forms := []string{secret, url.QueryEscape(secret), url.PathEscape(secret), url.UserPassword("", secret).String()[1:]}
	if s, err := url.PathUnescape(secret); err == nil {
		forms = append(forms, s)
	}
	if s, err := url.QueryUnescape(secret); err == nil {
		forms = append(forms, s)
	}
	for _, f := range forms[:len(forms):len(forms)] {
		q := strconv.Quote(f)
		forms = append(forms, q[1:len(q)-1])
	}
	for _, f := range forms {
		if f != "" && f != "@" {
			r.secrets = append(r.secrets, f)
		}
	}
}

// Redact returns s with every credential the Redactor knows replaced by
// "xxxxx".
func (r *Redactor) Redact(s string) string {
	if r == nil {
		return s
	}
	for _, secret := range r.secrets {
		s = strings.ReplaceAll(s, secret, "xxxxx")
	}
	return s
}
