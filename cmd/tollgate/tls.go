package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/store/redisurl"
)

// TLS for serve's listeners and for the Redis client.
//
// Certificates are files, as cert-manager, Vault agents and Kubernetes
// secrets provide them, and they are renewed in place. Every new
// connection (a TLS handshake) stats the files, which is cheap; when one
// has a new modification time or size, or is another file (renamed over
// the old one, a symbolic link switched), the files are read again and
// the new certificate serves from that connection on. Connections already
// open keep the certificate they started with. A renewal caught half-way
// (a new certificate beside the old key) does not load: the old files'
// contents keep serving, a warning is logged (at most one per
// --log-interval), and the next change is tried again. No signal is
// needed, and none is missed.
//
// The files are read as the rules are: regular files only (a FIFO would
// block its reader for ever, /dev/zero never ends), at most
// tlsMaxFileBytes each, and outside the handshake: a handshake that finds
// the files changed waits at most tlsReadWait for them to be read, then
// goes on with the certificate it has.

// listenerTLS is the TLS of one listener, from its flags.
type listenerTLS struct {
	name      string // "grpc" or "http", the flags' middle
	cert, key string
	clientCA  string // mTLS: the CAs client certificates must chain to
	clientSAN string // a SAN the verified client certificate must carry
}

func (l *listenerTLS) register(fs *flag.FlagSet, what string) {
	n := "--" + l.name + "-tls-"
	fs.StringVar(&l.cert, l.name+"-tls-cert", "", what+": serve TLS with this certificate chain (PEM; with "+n+"key); re-read when the file changes")
	fs.StringVar(&l.key, l.name+"-tls-key", "", what+": the private key of "+n+"cert (PEM)")
	fs.StringVar(&l.clientCA, l.name+"-tls-client-ca", "", what+": mTLS: require a client certificate signed by one of these CAs (PEM)")
	fs.StringVar(&l.clientSAN, l.name+"-tls-client-san", "", what+": mTLS: also require this subject alternative name (DNS name, URI or IP address) in the client certificate")
}

// check rejects half-given flags, naming the one that lacks its partner.
func (l *listenerTLS) check() error {
	n := "--" + l.name + "-tls-"
	switch {
	case l.cert != "" && l.key == "":
		return fmt.Errorf("%scert needs %skey", n, n)
	case l.key != "" && l.cert == "":
		return fmt.Errorf("%skey needs %scert", n, n)
	case l.clientCA != "" && l.cert == "":
		return fmt.Errorf("%sclient-ca needs %scert and %skey: mTLS is TLS first", n, n, n)
	case l.clientSAN != "" && l.clientCA == "":
		return fmt.Errorf("%sclient-san needs %sclient-ca: a name is only worth checking in a verified certificate", n, n)
	}
	return nil
}

// config returns the listener's server configuration, nil when it serves
// plain text. The files are read now, so a bad one stops the start; later
// changes are read by new connections (see above).
func (l *listenerTLS) config(nextProtos []string, log *slog.Logger, logEvery time.Duration) (*tls.Config, error) {
	if err := l.check(); err != nil {
		return nil, err
	}
	if l.cert == "" {
		return nil, nil
	}
	files := []string{l.cert, l.key}
	if l.clientCA != "" {
		files = append(files, l.clientCA)
	}
	r, err := newReloader(l.name+" TLS", files, func() (*tls.Config, error) { return l.load(nextProtos) }, log, logEvery)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: nextProtos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return r.get(), nil
		},
	}, nil
}

// load reads the listener's files into a complete server configuration.
func (l *listenerTLS) load(nextProtos []string) (*tls.Config, error) {
	n := "--" + l.name + "-tls-"
	cert, err := loadKeyPair(n+"cert", l.cert, n+"key", l.key)
	if err != nil {
		return nil, err
	}
	c := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		NextProtos:   nextProtos,
		Certificates: []tls.Certificate{cert},
	}
	if l.clientCA == "" {
		return c, nil
	}
	if c.ClientCAs, err = loadPool(n+"client-ca", l.clientCA); err != nil {
		return nil, err
	}
	c.ClientAuth = tls.RequireAndVerifyClientCert
	// A resumed session is not verified again: without tickets, a CA
	// taken out of the file admits no new connection from then on.
	// Gateways keep their connections for long; the full handshakes cost
	// little.
	c.SessionTicketsDisabled = true
	if san := l.clientSAN; san != "" {
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.VerifiedChains) == 0 || !hasSAN(cs.VerifiedChains[0][0], san) {
				return fmt.Errorf("tollgate: the client certificate does not carry the subject alternative name %q", san)
			}
			return nil
		}
	}
	return c, nil
}

// hasSAN reports whether cert names san among its subject alternative
// names: a DNS name (any case), a URI (such as a SPIFFE ID), an IP
// address or an e-mail address, compared whole. Wildcards in the
// certificate are not expanded: the name required is the client's
// identity, not a host to match.
func hasSAN(cert *x509.Certificate, san string) bool {
	if ip := net.ParseIP(san); ip != nil {
		return slices.ContainsFunc(cert.IPAddresses, ip.Equal)
	}
	for _, d := range cert.DNSNames {
		if strings.EqualFold(d, san) {
			return true
		}
	}
	for _, u := range cert.URIs {
		if u.String() == san {
			return true
		}
	}
	return slices.Contains(cert.EmailAddresses, san)
}

// loadKeyPair reads a certificate chain and its key, each with
// readTLSFile. crypto/tls's errors name what is wrong with a file, never
// its content.
func loadKeyPair(certFlag, certFile, keyFlag, keyFile string) (tls.Certificate, error) {
	c, err := readTLSFile(certFlag, certFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	k, err := readTLSFile(keyFlag, keyFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	cert, err := tls.X509KeyPair(c, k)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s %s, %s %s: %w", certFlag, certFile, keyFlag, keyFile, err)
	}
	return cert, nil
}

// tlsMaxFileBytes bounds each TLS file: a certificate chain and its key
// take a few kilobytes, and a CA bundle of 1 MiB holds several hundred
// CAs (the system's whole bundle is about 200 KiB).
const tlsMaxFileBytes = 1 << 20

// readTLSFile reads one TLS file as the rules loader reads rules files:
// a regular file (or a symbolic link to one) of at most tlsMaxFileBytes.
// It opens without blocking, so that a FIFO put in the file's place
// cannot hold its reader until a writer comes, then checks what it opened:
// no FIFO, device (/dev/zero), socket or directory is read. Errors name the
// flag and the file, never the content.
func readTLSFile(flagName, path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagName, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagName, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s %s: %s, not a regular file", flagName, path, fileKind(fi.Mode()))
	}
	if fi.Size() > tlsMaxFileBytes {
		return nil, fmt.Errorf("%s %s: larger than the limit of %d bytes", flagName, path, tlsMaxFileBytes)
	}
	b, err := io.ReadAll(io.LimitReader(f, tlsMaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", flagName, path, err)
	}
	if len(b) > tlsMaxFileBytes {
		return nil, fmt.Errorf("%s %s: larger than the limit of %d bytes", flagName, path, tlsMaxFileBytes)
	}
	return b, nil
}

// fileKind names what a file that is not a regular one is.
func fileKind(m os.FileMode) string {
	switch {
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeDevice != 0:
		return "a device"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m.IsDir():
		return "a directory"
	}
	return "a special file"
}

// loadPool reads the PEM certificates of file into a pool.
func loadPool(flagName, file string) (*x509.CertPool, error) {
	b, err := readTLSFile(flagName, file)
	if err != nil {
		return nil, err
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s %s: no PEM certificate in the file", flagName, file)
	}
	return p, nil
}

// tlsFlags are serve's listener TLS flags.
type tlsFlags struct {
	grpc, http listenerTLS
}

func (t *tlsFlags) register(fs *flag.FlagSet) {
	t.grpc.name, t.http.name = "grpc", "http"
	t.grpc.register(fs, "gRPC")
	t.http.register(fs, "HTTP")
}

// check rejects half-given listener flags.
func (t *tlsFlags) check() error {
	return errors.Join(t.grpc.check(), t.http.check())
}

// serveTLS is what the listener flags make: a configuration for each
// listener that serves TLS, nil for one that does not.
type serveTLS struct {
	grpc, http *tls.Config
	// refusals logs the gRPC handshakes that fail (the HTTP server logs
	// its own).
	refusals *refusalLog
}

// build checks the flags and reads the files. Its errors start with the
// flag at fault. Failed gRPC handshakes are logged at most once per
// logEvery.
func (t *tlsFlags) build(log *slog.Logger, logEvery time.Duration) (serveTLS, error) {
	s := serveTLS{refusals: &refusalLog{log: log, sample: engine.Sampler{Every: logEvery}}}
	var err error
	// gRPC needs HTTP/2, and grpc-go's clients require the server to say
	// so (ALPN).
	if s.grpc, err = t.grpc.config([]string{"h2"}, log, logEvery); err != nil {
		return serveTLS{}, err
	}
	if s.http, err = t.http.config([]string{"h2", "http/1.1"}, log, logEvery); err != nil {
		return serveTLS{}, err
	}
	for _, l := range []struct {
		name string
		f    *listenerTLS
		c    *tls.Config
	}{{"grpc", &t.grpc, s.grpc}, {"http", &t.http, s.http}} {
		switch {
		case l.c == nil:
		case l.f.clientCA == "":
			log.Info("TLS", "listener", l.name)
		default:
			log.Info("mTLS: client certificates required", "listener", l.name, "client_san", l.f.clientSAN)
		}
	}
	return s, nil
}

// grpcOptions returns the gRPC server's credentials, none for plain text.
func (s serveTLS) grpcOptions() []grpc.ServerOption {
	if s.grpc == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.Creds(loggedCreds{credentials.NewTLS(s.grpc), s.refusals})}
}

// refusalLog logs refused TLS handshakes: a client without a certificate,
// with one from another CA or without the required name, or one that does
// not speak TLS. An operator whose Envoy is refused finds the reason here;
// a client retrying in a loop writes one line per interval, which says how
// many were left out.
type refusalLog struct {
	log    *slog.Logger
	sample engine.Sampler
}

func (r *refusalLog) refused(remote net.Addr, err error) {
	ok, skipped := r.sample.Allow(time.Now())
	if !ok {
		return
	}
	r.log.Warn("gRPC TLS handshake refused", "remote", remote.String(), "error", err.Error(), engine.Skipped(skipped))
}

// loggedCreds are gRPC server credentials that log failed handshakes;
// grpc-go drops them silently.
type loggedCreds struct {
	credentials.TransportCredentials
	refusals *refusalLog
}

func (c loggedCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	nc, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil {
		c.refusals.refused(conn.RemoteAddr(), err)
	}
	return nc, info, err
}

func (c loggedCreds) Clone() credentials.TransportCredentials {
	return loggedCreds{c.TransportCredentials.Clone(), c.refusals}
}

// httpListener returns l serving TLS when the HTTP listener has it. The
// handshake happens on the connection's first read, so the HTTP server's
// read timeouts bound it.
func (s serveTLS) httpListener(l net.Listener) net.Listener {
	if s.http == nil {
		return l
	}
	return tls.NewListener(l, s.http)
}

// redisTLSFlags are the Redis client's TLS flags.
type redisTLSFlags struct {
	cert, key, ca string
	skipHostname  bool
}

func (r *redisTLSFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&r.cert, "redis-tls-cert", "", "Redis (rediss:// URLs): client certificate to present to a Redis with tls-auth-clients (PEM; with --redis-tls-key); re-read when the file changes")
	fs.StringVar(&r.key, "redis-tls-key", "", "Redis: the private key of --redis-tls-cert (PEM)")
	fs.StringVar(&r.ca, "redis-tls-ca", "", "Redis: the CAs that sign the Redis servers' certificates (PEM; default: the system's)")
	fs.BoolVar(&r.skipHostname, "redis-tls-skip-verify-hostname", false, "Redis: verify the servers' certificate chains but not that they name the host dialed (Cluster and Sentinel announce their nodes by IP address)")
}

// set reports whether any Redis TLS flag is given.
func (r *redisTLSFlags) set() bool {
	return r.cert != "" || r.key != "" || r.ca != "" || r.skipHostname
}

// options returns the Redis client's TLS option for url, none when no
// flag is given. Its errors start with the flag at fault. Files that fail
// to load again are logged at most once per logEvery.
func (r *redisTLSFlags) options(url string, log *slog.Logger, logEvery time.Duration) ([]redisurl.Option, error) {
	if !r.set() {
		return nil, nil
	}
	first := "--redis-tls-skip-verify-hostname"
	for _, f := range []struct{ name, v string }{{"--redis-tls-ca", r.ca}, {"--redis-tls-key", r.key}, {"--redis-tls-cert", r.cert}} {
		if f.v != "" {
			first = f.name
		}
	}
	switch {
	case r.cert != "" && r.key == "":
		return nil, errors.New("--redis-tls-cert needs --redis-tls-key")
	case r.key != "" && r.cert == "":
		return nil, errors.New("--redis-tls-key needs --redis-tls-cert")
	case url == "":
		return nil, fmt.Errorf("%s needs a rediss:// Redis URL (--redis or $REDIS_URL); there is none, so the memory store would serve", first)
	case !strings.HasPrefix(url, "rediss"):
		// Only the scheme is shown: the rest may hold a password.
		scheme, _, _ := strings.Cut(url, "://")
		return nil, fmt.Errorf("%s needs a rediss:// Redis URL, not %s://: TLS is what the URL's scheme says", first, scheme)
	}
	var files []string
	if r.cert != "" {
		files = append(files, r.cert, r.key)
	}
	if r.ca != "" {
		files = append(files, r.ca)
	}
	t := redisurl.TLS{SkipVerifyHostname: r.skipHostname}
	if len(files) == 0 {
		return []redisurl.Option{redisurl.WithTLS(t)}, nil
	}
	rl, err := newReloader("redis TLS", files, r.load, log, logEvery)
	if err != nil {
		return nil, err
	}
	if r.cert != "" {
		t.ClientCertificate = func() (*tls.Certificate, error) { return rl.get().cert, nil }
	}
	if r.ca != "" {
		t.RootCAs = func() *x509.CertPool { return rl.get().roots }
	}
	return []redisurl.Option{redisurl.WithTLS(t)}, nil
}

// redisTLSFiles are the contents of the Redis TLS files.
type redisTLSFiles struct {
	cert  *tls.Certificate // nil without --redis-tls-cert
	roots *x509.CertPool   // nil without --redis-tls-ca
}

func (r *redisTLSFlags) load() (redisTLSFiles, error) {
	var f redisTLSFiles
	if r.cert != "" {
		c, err := loadKeyPair("--redis-tls-cert", r.cert, "--redis-tls-key", r.key)
		if err != nil {
			return redisTLSFiles{}, err
		}
		f.cert = &c
	}
	if r.ca != "" {
		p, err := loadPool("--redis-tls-ca", r.ca)
		if err != nil {
			return redisTLSFiles{}, err
		}
		f.roots = p
	}
	return f, nil
}

// reloader holds what a set of files says and reads the files again when
// they change: on get, at most once per change, outside the caller.
type reloader[T any] struct {
	what   string // for the log: "grpc TLS", "redis TLS"
	files  []string
	load   func() (T, error)
	log    *slog.Logger
	sample engine.Sampler // the failures' log lines
	wait   time.Duration  // how long get waits for a read (tlsReadWait)

	mu     sync.Mutex
	cur    T
	stamps []fileStamp // of the files cur was read from
	tried  []fileStamp // of the last files that failed to load
	read   *fileRead   // the read under way, nil when none
}

// fileRead is one read of a reloader's files, in the background.
type fileRead struct {
	stamps []fileStamp // what the files were when it started
	start  time.Time
	done   chan struct{} // closed when it has ended
}

// tlsReadWait is how long a new connection that finds the TLS files
// changed waits for them to be read before it goes on with the
// certificate that served until then. Reading a few kilobytes from a
// local disk takes well under a millisecond; a file system that hangs
// delays new connections by this much once, not for ever.
const tlsReadWait = time.Second

// fileStamp is what a stat says of a file: enough to see it replaced
// (renamed over, or a symbolic link switched, as Kubernetes updates a
// secret's volume) or rewritten, and cheap enough for every handshake.
type fileStamp struct {
	fi os.FileInfo // nil: the stat failed (the file is gone, for now)
}

func (a fileStamp) same(b fileStamp) bool {
	if a.fi == nil || b.fi == nil {
		return a.fi == nil && b.fi == nil
	}
	return os.SameFile(a.fi, b.fi) && a.fi.ModTime().Equal(b.fi.ModTime()) && a.fi.Size() == b.fi.Size()
}

func sameStamps(a, b []fileStamp) bool {
	return slices.EqualFunc(a, b, fileStamp.same)
}

// newReloader loads the files once; its error stops the start. Failed
// reloads are logged at most once per logEvery.
func newReloader[T any](what string, files []string, load func() (T, error), log *slog.Logger, logEvery time.Duration) (*reloader[T], error) {
	r := &reloader[T]{what: what, files: files, load: load, log: log, sample: engine.Sampler{Every: logEvery}, wait: tlsReadWait}
	r.stamps = r.stat()
	v, err := load()
	if err != nil {
		return nil, err
	}
	r.cur = v
	return r, nil
}

// stat stats the files. A stat never blocks on what a file is (a FIFO, a
// device): only reading does.
func (r *reloader[T]) stat() []fileStamp {
	s := make([]fileStamp, len(r.files))
	for i, f := range r.files {
		if fi, err := os.Stat(f); err == nil {
			s[i].fi = fi
		}
	}
	return s
}

// get returns the files' current contents. When they changed since the
// last read, it starts a read in the background (one at a time) and
// waits for it up to r.wait from that read's start, so that the first
// connection after a renewal gets the new certificate; past that, it
// returns what served before. A read that fails keeps what served before
// and is logged; the same files are not read again until one of them
// changes. A read that has not ended after r.wait gives way to a new one
// when the files change again.
func (r *reloader[T]) get() T {
	now := r.stat()
	r.mu.Lock()
	if sameStamps(now, r.stamps) || sameStamps(now, r.tried) {
		defer r.mu.Unlock()
		return r.cur
	}
	rd := r.read
	if rd == nil || (!sameStamps(now, rd.stamps) && time.Since(rd.start) > r.wait) {
		rd = &fileRead{stamps: now, start: time.Now(), done: make(chan struct{})}
		r.read = rd
		go r.reload(rd)
	}
	r.mu.Unlock()
	if left := r.wait - time.Since(rd.start); left > 0 {
		t := time.NewTimer(left)
		select {
		case <-rd.done:
		case <-t.C:
			r.warn("the changed TLS files are not read yet; the previous certificates keep serving",
				slog.String("waited", r.wait.String()), slog.String("files", strings.Join(r.files, ",")))
		}
		t.Stop()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

// reload reads the files for rd and, unless a newer read took its place,
// makes what it read current.
func (r *reloader[T]) reload(rd *fileRead) {
	defer close(rd.done)
	v, err := r.load()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.read != rd {
		return // given up on: a newer read decides
	}
	r.read = nil
	// The stat taken before the read: a change during the read shows at
	// the next handshake and is read then.
	if err != nil {
		r.tried = rd.stamps
		r.warn("the changed TLS files do not load; the previous certificates keep serving", slog.String("error", err.Error()))
		return
	}
	r.cur, r.stamps, r.tried = v, rd.stamps, nil
	r.log.Info("TLS files reloaded", "what", r.what, "files", strings.Join(r.files, ","))
}

// warn logs a failure to reload, at most once per r.sample's interval.
func (r *reloader[T]) warn(msg string, attrs ...slog.Attr) {
	ok, skipped := r.sample.Allow(time.Now())
	if !ok {
		return
	}
	attrs = append([]slog.Attr{slog.String("what", r.what)}, append(attrs, engine.Skipped(skipped))...)
	r.log.LogAttrs(context.Background(), slog.LevelWarn, msg, attrs...)
}
