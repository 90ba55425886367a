// Package redisurl makes go-redis clients from URLs: one server, Sentinel or
// Cluster, said by the scheme, with TLS and a password that may be kept out
// of the URL, and errors and logs that never show a credential (Redactor).
// redisstore.NewClient is its public face; tollgate serve adds the password
// and TLS settings of its flags.
package redisurl

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Option changes how NewClient connects.
type Option func(*options)

type options struct {
	password    string
	hasPassword bool
	tls         *TLS
}

// WithPassword sets the password of the Redis servers that hold the
// data, replacing the one in the URL: a password kept out of the URL need
// not appear in a command line or an environment that other users can read.
// For Sentinel it is the master's and replicas' password (the URL's password
// option), not the sentinels' own (the URL's user information).
func WithPassword(password string) Option {
	return func(o *options) { o.password, o.hasPassword = password, true }
}

// TLS is what a rediss:// URL cannot say about TLS: the client
// certificate to present to a Redis that requires one (tls-auth-clients
// yes), the CAs that sign the servers' certificates, and whether the
// certificates must name the host dialed. Its functions are called for
// every new connection, so they may return renewed certificates and CAs
// without the client being rebuilt.
//
// With neither RootCAs nor SkipVerifyHostname, servers are verified the
// usual way: against the system's CAs and the URL's host. A URL option
// skip_verify=true switches every check off and wins over both.
type TLS struct {
	// ClientCertificate returns the certificate and key to present when
	// the server asks for one; nil presents none.
	ClientCertificate func() (*tls.Certificate, error)
	// RootCAs returns the CAs the servers' certificates must chain to;
	// nil means the system's.
	RootCAs func() *x509.CertPool
	// SkipVerifyHostname still verifies the chain but not that the
	// certificate names the host. Cluster nodes and a Sentinel's master are
	// dialed at the addresses they announce, usually IP addresses, while
	// the name checked is the URL's first host: their certificates rarely
	// match it.
	SkipVerifyHostname bool
}

// WithTLS adds a client certificate, CAs or relaxed name checks to
// the TLS of a rediss://, rediss+sentinel:// or rediss+cluster:// URL; with a
// URL without TLS, NewClient fails rather than connect in plain text.
// For Sentinel the same settings apply to the sentinels and to the data
// servers.
func WithTLS(t TLS) Option {
	return func(o *options) { o.tls = &t }
}

// errRedisTLSPlain is the error of TLS settings given with a plain URL.
var errRedisTLSPlain = errors.New("TLS settings (client certificate, CA) need a rediss:// URL, and this one is plain redis://")

// config returns the TLS configuration for a client whose URL asked for
// base (nil: the URL has no TLS).
func (t *TLS) config(base *tls.Config) (*tls.Config, error) {
	if t == nil {
		return base, nil
	}
	if base == nil {
		return nil, errRedisTLSPlain
	}
	c := base.Clone()
	c.MinVersion = max(c.MinVersion, tls.VersionTLS12)
	if t.ClientCertificate != nil {
		get := t.ClientCertificate
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return get() }
	}
	if c.InsecureSkipVerify || (t.RootCAs == nil && !t.SkipVerifyHostname) {
		return c, nil
	}
	// crypto/tls verifies against one fixed pool and always checks the
	// name; this verification reads the CAs anew and may leave the name
	// out. InsecureSkipVerify only turns the built-in one off.
	name, roots, skipName := c.ServerName, t.RootCAs, t.SkipVerifyHostname
	c.InsecureSkipVerify = true
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		return verifyRedisServer(cs.PeerCertificates, roots, name, skipName)
	}
	return c, nil
}

// verifyRedisServer verifies a server's certificate chain as crypto/tls
// would, against the CAs of roots (the system's when it or its answer is
// nil), and that the leaf names host unless skipName.
func verifyRedisServer(certs []*x509.Certificate, roots func() *x509.CertPool, host string, skipName bool) error {
	if len(certs) == 0 {
		return errors.New("redisstore: redis TLS: the server sent no certificate")
	}
	opts := x509.VerifyOptions{Intermediates: x509.NewCertPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if roots != nil {
		opts.Roots = roots()
	}
	if !skipName {
		opts.DNSName = host
	}
	for _, c := range certs[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := certs[0].Verify(opts); err != nil {
		return fmt.Errorf("redisstore: redis TLS: verify the server's certificate: %w", err)
	}
	return nil
}

// NewClient returns a Redis client for rawURL. The forms are go-redis's
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
// own messages, are passed through a Redactor first. WithTLS adds a
// client certificate and CAs to the URL's TLS.
func NewClient(rawURL string, opts ...Option) (redis.UniversalClient, error) {
	var ro options
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
		return nil, fmt.Errorf("redisstore: redis URL %q has no scheme (want redis://, rediss://, redis+sentinel:// or redis+cluster://)", shown)
	}
	base, kind, _ := strings.Cut(scheme, "+")
	if (base != "redis" && base != "rediss") || (kind != "" && kind != "sentinel" && kind != "cluster") {
		return nil, fmt.Errorf("redisstore: redis URL scheme %q: want redis, rediss, redis+sentinel, rediss+sentinel, redis+cluster or rediss+cluster", red.Redact(scheme))
	}
	plain := base + "://" + rest
	// net/url's errors quote the whole URL, or a fragment of a bad
	// %-escape that may be part of a password: parse here, and say only
	// what to check.
	if _, err := url.Parse(plain); err != nil {
		return nil, fmt.Errorf("redisstore: redis URL %s: malformed (check the host, the port and the %%-escapes of the user information and options)", shown)
	}
	// go-redis's errors are redacted and not wrapped: a caller unwrapping
	// one would find the raw text again, password and all.
	wrap := func(err error) error {
		return fmt.Errorf("redisstore: redis URL %s: %s", shown, red.Redact(err.Error()))
	}
	// finish sets what every kind of client takes from the options: the
	// password, TLS, and deadlines taken from the context.
	finish := func(password *string, tc **tls.Config, ctxDeadlines *bool) error {
		if ro.hasPassword {
			*password = ro.password
		}
		var err error
		if *tc, err = ro.tls.config(*tc); err != nil {
			return fmt.Errorf("redisstore: redis URL %s: %w", shown, err)
		}
		*ctxDeadlines = true
		return nil
	}
	switch kind {
	case "":
		o, err := redis.ParseURL(plain)
		if err != nil {
			return nil, wrap(err)
		}
		if err := finish(&o.Password, &o.TLSConfig, &o.ContextTimeoutEnabled); err != nil {
			return nil, err
		}
		return redis.NewClient(o), nil
	case "sentinel":
		o, err := redis.ParseFailoverURL(plain)
		if err != nil {
			return nil, wrap(err)
		}
		if o.MasterName == "" {
			return nil, fmt.Errorf("redisstore: redis URL %s: a Sentinel URL needs the master_name parameter", shown)
		}
		if err := finish(&o.Password, &o.TLSConfig, &o.ContextTimeoutEnabled); err != nil {
			return nil, err
		}
		return redis.NewFailoverClient(o), nil
	default: // cluster
		o, err := redis.ParseClusterURL(plain)
		if err != nil {
			return nil, wrap(err)
		}
		if err := finish(&o.Password, &o.TLSConfig, &o.ContextTimeoutEnabled); err != nil {
			return nil, err
		}
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
