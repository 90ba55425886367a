package xds

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"
)

// ParseHeaders reads CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS as
// envoyproxy/ratelimit reads it: "name:value,name:value", each entry one
// colon, so that neither a name nor a value holds a ',' or a ':'. Names
// are lower-cased, as gRPC sends them, and must be header names gRPC
// accepts; values must be printable ASCII. A value is a credential as a
// rule (an authorization header): no error names it, nor the entry that
// holds it, only its place and its header's name.
func ParseHeaders(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	h := map[string]string{}
	for i, entry := range strings.Split(s, ",") {
		name, value, ok := strings.Cut(entry, ":")
		if !ok || strings.Contains(value, ":") {
			return nil, fmt.Errorf("xds: header entry %d is not name:value with one colon", i+1)
		}
		name = strings.ToLower(name)
		if !validHeaderName(name) {
			return nil, fmt.Errorf("xds: header entry %d: %q is not a header name gRPC sends (letters, digits, '-', '_' and '.', not starting with grpc-)", i+1, name)
		}
		for _, c := range []byte(value) {
			if c < 0x20 || c > 0x7e {
				return nil, fmt.Errorf("xds: header %s: the value holds a byte that is not printable ASCII", name)
			}
		}
		h[name] = value
	}
	return h, nil
}

func validHeaderName(name string) bool {
	if name == "" || strings.HasPrefix(name, "grpc-") {
		return false
	}
	for _, c := range []byte(name) {
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
		if !ok {
			return false
		}
	}
	return true
}

// ParseNodeMetadata reads CONFIG_GRPC_XDS_NODE_METADATA as
// envoyproxy/ratelimit reads it: "key=value,key=value", each value a
// string. An entry without '=' is left out, as envoy leaves it out (its
// own documentation shows "key:value", which it does not read); such
// entries are returned, for the caller to warn about.
func ParseNodeMetadata(s string) (md map[string]string, ignored []string) {
	if s == "" {
		return nil, nil
	}
	md = map[string]string{}
	for _, entry := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(entry, "=")
		if !ok {
			ignored = append(ignored, entry)
			continue
		}
		md[k] = v
	}
	return md, ignored
}

// TLSFiles say how to reach the management server over TLS: with a client
// certificate (mTLS) when Cert and Key are set, trusting CA alone when it
// is set, else the system's roots, and checking that the server's
// certificate names ServerName when set, else the host of the server's
// address. The files are read again on every connection, so that a
// renewed certificate is used from the next reconnection on.
type TLSFiles struct {
	Cert, Key, CA string
	ServerName    string
}

// config reads the files into a TLS client configuration.
func (f *TLSFiles) config() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	switch {
	case f.Cert != "" && f.Key != "":
		kp, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("xds: client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{kp}
	case f.Cert != "" || f.Key != "":
		return nil, errors.New("xds: a client certificate needs both its certificate and its key")
	}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("xds: server CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("xds: server CA: %s holds no PEM certificate", f.CA)
		}
		c.RootCAs = pool
	}
	return c, nil
}

// Backoff is how long to wait before reconnecting to the management
// server: Initial after the first failure, twice as long after each
// failure in a row; with Jitter, each wait is drawn at random within
// ±RandomFactor of that (0.5: between half and one and a half times); and
// never more than Max. A connection that delivered a response starts the
// count again.
type Backoff struct {
	Initial, Max time.Duration
	RandomFactor float64
	Jitter       bool
}

// DefaultBackoff is envoyproxy/ratelimit's settings: 10 s, at most 60 s,
// ±50 %.
var DefaultBackoff = Backoff{Initial: 10 * time.Second, Max: 60 * time.Second, RandomFactor: 0.5, Jitter: true}

// wait is the wait after n failures in a row (n ≥ 1); rnd is in [0, 1).
func (b Backoff) wait(n int, rnd float64) time.Duration {
	d := max(b.Initial, time.Millisecond)
	for i := 1; i < n && d < b.Max; i++ {
		d *= 2
	}
	if b.Jitter && b.RandomFactor > 0 {
		f := min(b.RandomFactor, 1)
		d = time.Duration(float64(d) * (1 - f + 2*f*rnd))
	}
	return max(min(d, max(b.Max, b.Initial)), time.Millisecond)
}

// next is the wait after n failures in a row.
func (b Backoff) next(n int) time.Duration { return b.wait(n, rand.Float64()) }
