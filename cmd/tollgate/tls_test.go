package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tollgate/tollgate/internal/store/redisurl"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
)

// The tests below make their own PKI: certificate authorities, server and
// client certificates (ECDSA P-256), written to PEM files in the test's
// directory as cert-manager writes them, and run the real binary and a
// real redis-server with them.

// testCA is a certificate authority of a test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

var serial atomic.Int64

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial.Add(1)),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// leaf is a certificate issued by a testCA, with its key, in PEM.
type leaf struct {
	serial          int64
	certPEM, keyPEM []byte
}

// issue makes a certificate for names: each an IP address, a URI (it has
// "://") or a DNS name. It may serve both sides of a connection.
func (ca *testCA) issue(t *testing.T, cn string, names ...string) leaf {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if strings.Contains(n, "://") {
			u, err := url.Parse(n)
			if err != nil {
				t.Fatal(err)
			}
			tmpl.URIs = append(tmpl.URIs, u)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return leaf{
		serial:  tmpl.SerialNumber.Int64(),
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	}
}

// files writes the leaf to dir as name.crt and name.key.
func (l leaf) files(t *testing.T, dir, name string) (cert, key string) {
	t.Helper()
	cert, key = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	replaceFile(t, cert, l.certPEM)
	replaceFile(t, key, l.keyPEM)
	return cert, key
}

// tlsCert is the leaf as crypto/tls holds it.
func (l leaf) tlsCert(t *testing.T) tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(l.certPEM, l.keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// replaceFile writes data to path as renewals do: to a new file, renamed
// over the old one, so no reader sees half of it.
func replaceFile(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func writeCA(t *testing.T, dir, name string, ca *testCA) string {
	t.Helper()
	p := filepath.Join(dir, name+".crt")
	replaceFile(t, p, ca.pem)
	return p
}

func pool(cas ...*testCA) *x509.CertPool {
	p := x509.NewCertPool()
	for _, ca := range cas {
		p.AddCert(ca.cert)
	}
	return p
}

// tlsRules writes a rules file with a limit that decisions never reach and
// one of 1 a minute, and returns its path.
func tlsRules(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rules.yaml")
	rules := "domain: tls\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100000}\n  - key: once\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	if err := os.WriteFile(p, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// pki is the certificates of the listener tests: one CA signs tollgate's
// certificate and the clients'; a foreign CA signs a client certificate
// with the right name.
type pki struct {
	dir                                   string
	ca, foreign                           *testCA
	server, client, wrongSAN, foreignCert leaf
}

const clientSAN = "spiffe://tollgate.test/envoy"

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir(), ca: newTestCA(t, "tollgate test CA"), foreign: newTestCA(t, "foreign CA")}
	p.server = p.ca.issue(t, "tollgate", "localhost", "127.0.0.1")
	p.client = p.ca.issue(t, "envoy", clientSAN, "envoy.test")
	p.wrongSAN = p.ca.issue(t, "other", "spiffe://tollgate.test/other", "other.test")
	p.foreignCert = p.foreign.issue(t, "envoy", clientSAN, "envoy.test")
	return p
}

// clientTLS is a client's TLS configuration: it trusts the test CA and
// presents cert, if any, whatever CAs the server asks for (crypto/tls
// would keep a foreign CA's certificate to itself; other clients send it).
func (p *pki) clientTLS(t *testing.T, cert *leaf) *tls.Config {
	c := &tls.Config{RootCAs: pool(p.ca)}
	if cert != nil {
		tc := cert.tlsCert(t)
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tc, nil }
	}
	return c
}

// tlsClient is one client of the listener tests.
type tlsClient struct {
	name    string
	tls     *tls.Config // nil: plain text
	refused bool
	reason  string // what the service logs when it refuses the client
}

func (p *pki) clients(t *testing.T) []tlsClient {
	old := p.clientTLS(t, &p.client)
	old.MinVersion, old.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
	return []tlsClient{
		{"the CA's certificate with the SAN", p.clientTLS(t, &p.client), false, ""},
		{"no certificate", p.clientTLS(t, nil), true, "client didn't provide a certificate"},
		{"a foreign CA's certificate with the SAN", p.clientTLS(t, &p.foreignCert), true, "certificate signed by unknown authority"},
		{"the CA's certificate without the SAN", p.clientTLS(t, &p.wrongSAN), true, `does not carry the subject alternative name \\"spiffe://tollgate.test/envoy\\"`},
		{"TLS 1.1", old, true, "client offered only unsupported versions"},
		{"plain text", nil, true, "first record does not look like a TLS handshake|client sent an HTTP request to an HTTPS server"},
	}
}

// startMTLS runs tollgate serve with mTLS on both listeners, each requiring
// clientSAN.
func startMTLS(t *testing.T, p *pki, extra ...string) *proc {
	t.Helper()
	cert, key := p.server.files(t, p.dir, "server")
	ca := writeCA(t, p.dir, "ca", p.ca)
	args := []string{"--config", tlsRules(t),
		"--grpc-tls-cert", cert, "--grpc-tls-key", key, "--grpc-tls-client-ca", ca, "--grpc-tls-client-san", clientSAN,
		"--http-tls-cert", cert, "--http-tls-key", key, "--http-tls-client-ca", ca, "--http-tls-client-san", clientSAN}
	// Every refusal logged, for the tests to find.
	args = append(args, "--log-interval", "0")
	return startTollgate(t, "serve", append(args, extra...)...)
}

// TestServeMTLSGRPC calls the gRPC listener with mTLS on: only a client
// certificate from the CA that carries the required SAN is answered.
func TestServeMTLSGRPC(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	tg := startMTLS(t, p)
	for _, tc := range p.clients(t) {
		t.Run(tc.name, func(t *testing.T) {
			creds := insecure.NewCredentials()
			if tc.tls != nil {
				creds = credentials.NewTLS(tc.tls)
			}
			conn, err := grpc.NewClient(tg.grpc, grpc.WithTransportCredentials(creds))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, request("tls", desc("k", randomID())))
			if tc.refused {
				if got, want := status.Code(err), codes.Unavailable; got != want {
					t.Fatalf("ShouldRateLimit: code %v (%v), want %v: the connection refused", got, err, want)
				}
				tg.log.waitFor(t, regexp.MustCompile(`msg="gRPC TLS handshake refused".*(`+tc.reason+`)`), 10*time.Second)
				return
			}
			if err != nil {
				t.Fatalf("ShouldRateLimit: %v", err)
			}
			if got, want := codesOf(resp), "OK: OK"; got != want {
				t.Errorf("ShouldRateLimit: %s, want %s", got, want)
			}
		})
	}
}

// TestServeMTLSHTTP calls the HTTP listener with mTLS on, over HTTP/2 and
// HTTP/1.1.
func TestServeMTLSHTTP(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	tg := startMTLS(t, p)
	base := strings.Replace(tg.http, "http://", "https://", 1)
	for _, tc := range p.clients(t) {
		for _, h2 := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/h2=%v", tc.name, h2), func(t *testing.T) {
				// The transport adds to the configuration's NextProtos: a
				// copy for each.
				tr := &http.Transport{TLSClientConfig: tc.tls.Clone(), ForceAttemptHTTP2: h2}
				defer tr.CloseIdleConnections()
				u := base
				if tc.tls == nil {
					u = tg.http
				}
				resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(u + "/healthcheck")
				if tc.refused {
					// crypto/tls answers plain text with a 400 of its own.
					if err == nil {
						resp.Body.Close()
						if tc.tls != nil || resp.StatusCode != http.StatusBadRequest {
							t.Fatalf("GET /healthcheck: %s, want the connection refused", resp.Status)
						}
					}
					tg.log.waitFor(t, regexp.MustCompile(`TLS handshake error.*(`+tc.reason+`)`), 10*time.Second)
					return
				}
				if err != nil {
					t.Fatalf("GET /healthcheck: %v", err)
				}
				resp.Body.Close()
				if got, want := resp.StatusCode, http.StatusOK; got != want {
					t.Errorf("GET /healthcheck: %d, want %d", got, want)
				}
				want := "HTTP/1.1"
				if h2 {
					want = "HTTP/2.0"
				}
				if got := resp.Proto; got != want {
					t.Errorf("protocol %s, want %s", got, want)
				}
			})
		}
	}
}

// TestServeMTLSNoResumption connects twice to the HTTP listener with a
// session cache: the second connection is verified afresh, not resumed.
func TestServeMTLSNoResumption(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	tg := startMTLS(t, p)
	c := p.clientTLS(t, &p.client)
	c.ClientSessionCache = tls.NewLRUClientSessionCache(4)
	tr := &http.Transport{TLSClientConfig: c, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	base := strings.Replace(tg.http, "http://", "https://", 1)
	var resumed []bool
	for range 2 {
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(base + "/healthcheck")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		resumed = append(resumed, resp.TLS.DidResume)
	}
	if got, want := fmt.Sprint(resumed), "[false false]"; got != want {
		t.Errorf("connections resumed: %s, want %s", got, want)
	}
}

// servedSerial returns the serial number of the certificate a new TLS
// connection to addr is served.
func servedSerial(t *testing.T, addr string, c *tls.Config) int64 {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, c)
	if err != nil {
		t.Fatalf("TLS to %s: %v", addr, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
}

// TestServeTLSReload renews the certificate files under a running serve:
// a new connection gets the new certificate, and a renewal caught half-way
// (a new certificate beside the old key) keeps the old pair serving.
func TestServeTLSReload(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	tg := startMTLS(t, p)
	addrs := map[string]string{"grpc": tg.grpc, "http": strings.TrimPrefix(tg.http, "http://")}
	c := p.clientTLS(t, &p.client)
	for name, addr := range addrs {
		if got, want := servedSerial(t, addr, c), p.server.serial; got != want {
			t.Fatalf("%s at start: certificate %d, want %d", name, got, want)
		}
	}

	// Half-way: the new certificate is there, its key not yet.
	next := p.ca.issue(t, "tollgate", "localhost", "127.0.0.1")
	replaceFile(t, filepath.Join(p.dir, "server.crt"), next.certPEM)
	for name, addr := range addrs {
		if got, want := servedSerial(t, addr, c), p.server.serial; got != want {
			t.Errorf("%s with a mismatched pair: certificate %d, want the old %d", name, got, want)
		}
	}
	tg.log.waitFor(t, regexp.MustCompile(`changed TLS files do not load`), 10*time.Second)

	// The key arrives.
	replaceFile(t, filepath.Join(p.dir, "server.key"), next.keyPEM)
	for name, addr := range addrs {
		if got, want := servedSerial(t, addr, c), next.serial; got != want {
			t.Errorf("%s after renewal: certificate %d, want the new %d", name, got, want)
		}
	}
	tg.log.waitFor(t, regexp.MustCompile(`TLS files reloaded`), 10*time.Second)
	if got := tg.log.String(); strings.Contains(got, "PRIVATE KEY") {
		t.Errorf("the log holds key material:\n%s", got)
	}
}

// TestServeTLSFlags starts serve with TLS flags that cannot work: it stops
// at once, naming the flag, and never prints key material or a password.
func TestServeTLSFlags(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	cert, key := p.server.files(t, p.dir, "server")
	ca := writeCA(t, p.dir, "ca", p.ca)
	rules := tlsRules(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"grpc cert without key", []string{"--grpc-tls-cert", cert}, "--grpc-tls-cert needs --grpc-tls-key"},
		{"grpc key without cert", []string{"--grpc-tls-key", key}, "--grpc-tls-key needs --grpc-tls-cert"},
		{"grpc client CA without cert", []string{"--grpc-tls-client-ca", ca}, "--grpc-tls-client-ca needs --grpc-tls-cert"},
		{"grpc SAN without client CA", []string{"--grpc-tls-cert", cert, "--grpc-tls-key", key, "--grpc-tls-client-san", "x"}, "--grpc-tls-client-san needs --grpc-tls-client-ca"},
		{"http cert without key", []string{"--http-tls-cert", cert}, "--http-tls-cert needs --http-tls-key"},
		{"http client CA without cert", []string{"--http-tls-client-ca", ca}, "--http-tls-client-ca needs --http-tls-cert"},
		{"http cert and key swapped", []string{"--http-tls-cert", key, "--http-tls-key", cert}, "--http-tls-cert " + key},
		{"grpc key of another certificate", []string{"--grpc-tls-cert", cert, "--grpc-tls-key", writeKeyOnly(t, p)}, "private key does not match public key"},
		{"http client CA not PEM", []string{"--http-tls-cert", cert, "--http-tls-key", key, "--http-tls-client-ca", key}, "--http-tls-client-ca " + key + ": no PEM certificate"},
		{"redis cert without key", []string{"--redis", "rediss://127.0.0.1:1", "--redis-tls-cert", cert}, "--redis-tls-cert needs --redis-tls-key"},
		{"redis key without cert", []string{"--redis", "rediss://127.0.0.1:1", "--redis-tls-key", key}, "--redis-tls-key needs --redis-tls-cert"},
		{"redis TLS without Redis", []string{"--redis-tls-ca", ca}, "--redis-tls-ca needs a rediss:// Redis URL"},
		{"redis TLS with plain Redis", []string{"--redis", "redis://:hunter2secret@127.0.0.1:1", "--redis-tls-cert", cert, "--redis-tls-key", key}, "--redis-tls-cert needs a rediss:// Redis URL, not redis://"},
		{"redis key of another certificate", []string{"--redis", "rediss://:hunter2secret@127.0.0.1:1", "--redis-tls-cert", cert, "--redis-tls-key", writeKeyOnly(t, p)}, "private key does not match public key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append([]string{"tollgate", "serve", "--config", rules, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, tc.args...)
			code := run(context.Background(), args, func(string) string { return "" }, &stdout, &stderr)
			if got, want := code, 2; got != want {
				t.Errorf("exit code %d, want %d; stderr:\n%s", got, want, stderr.String())
			}
			if got := stderr.String(); !strings.Contains(got, tc.want) {
				t.Errorf("stderr:\n%s\nwant it to say %q", got, tc.want)
			}
			for _, secret := range []string{"PRIVATE KEY", "hunter2secret", string(p.server.keyPEM[40:80])} {
				if strings.Contains(stderr.String(), secret) {
					t.Errorf("stderr holds %q:\n%s", secret, stderr.String())
				}
			}
		})
	}
}

// writeKeyOnly writes the key of a new certificate, which matches no
// certificate the test uses, and returns its path.
func writeKeyOnly(t *testing.T, p *pki) string {
	t.Helper()
	l := p.ca.issue(t, "stray")
	path := filepath.Join(t.TempDir(), "stray.key")
	replaceFile(t, path, l.keyPEM)
	return path
}

// TestHasSAN matches a required name against a certificate's names.
func TestHasSAN(t *testing.T) {
	t.Parallel()
	u, _ := url.Parse("spiffe://cluster.local/ns/edge/sa/envoy")
	cert := &x509.Certificate{
		DNSNames:       []string{"envoy.edge.svc", "*.edge.svc"},
		URIs:           []*url.URL{u},
		IPAddresses:    []net.IP{net.ParseIP("10.0.0.7"), net.ParseIP("fd00::7")},
		EmailAddresses: []string{"envoy@example.com"},
	}
	for _, tc := range []struct {
		san  string
		want bool
	}{
		{"envoy.edge.svc", true},
		{"ENVOY.edge.svc", true},
		{"other.edge.svc", false}, // the wildcard is a name, not a pattern
		{"*.edge.svc", true},
		{"spiffe://cluster.local/ns/edge/sa/envoy", true},
		{"spiffe://cluster.local/ns/edge/sa/other", false},
		{"10.0.0.7", true},
		{"fd00:0::7", true},
		{"10.0.0.8", false},
		{"envoy@example.com", true},
		{"envoy", false},
	} {
		if got := hasSAN(cert, tc.san); got != tc.want {
			t.Errorf("hasSAN(%q) = %v, want %v", tc.san, got, tc.want)
		}
	}
}

// tlsRedis starts a redis-server that speaks TLS on its TLS port and
// requires a client certificate from clientCA. The plain port stays on,
// for redistest's readiness probe and the test's own look at the keys.
func tlsRedis(t *testing.T, dir string, server leaf, clientCA *testCA) (*redistest.Server, int) {
	t.Helper()
	cert, key := server.files(t, dir, "redis")
	ca := writeCA(t, dir, "redis-client-ca", clientCA)
	var lastErr error
	// The TLS port is chosen here, so another process may take it before
	// redis-server binds it: a few tries.
	for range 3 {
		port := freeLoopbackPort(t)
		s, err := redistest.StartServer(redistest.WithArgs("--tls-port", strconv.Itoa(port),
			"--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", ca, "--tls-auth-clients", "yes"))
		if err == nil {
			t.Cleanup(s.Close)
			return s, port
		}
		lastErr = err
	}
	t.Fatal(lastErr)
	return nil, 0
}

func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestServeRedisTLS decides against a Redis that requires client
// certificates. With the right certificate and CA decisions count in
// Redis; without, tollgate starts all the same, answers by failure mode
// and says it is not ready.
func TestServeRedisTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, clientCA, foreign := newTestCA(t, "redis CA"), newTestCA(t, "redis client CA"), newTestCA(t, "foreign CA")
	// The server's certificate names its IP address, not "localhost".
	rdb, port := tlsRedis(t, dir, ca.issue(t, "redis", "127.0.0.1", "redis.test"), clientCA)
	caFile := writeCA(t, dir, "redis-ca", ca)
	foreignCAFile := writeCA(t, dir, "foreign-ca", foreign)
	cert, key := clientCA.issue(t, "tollgate").files(t, dir, "client")
	strayCert, strayKey := foreign.issue(t, "tollgate").files(t, dir, "stray")
	byIP := fmt.Sprintf("rediss://127.0.0.1:%d", port)
	byName := fmt.Sprintf("rediss://localhost:%d", port)

	for _, tc := range []struct {
		name  string
		args  []string
		works bool
	}{
		{"client certificate", []string{"--redis", byIP, "--redis-tls-cert", cert, "--redis-tls-key", key, "--redis-tls-ca", caFile}, true},
		{"no client certificate", []string{"--redis", byIP, "--redis-tls-ca", caFile}, false},
		{"client certificate from a foreign CA", []string{"--redis", byIP, "--redis-tls-cert", strayCert, "--redis-tls-key", strayKey, "--redis-tls-ca", caFile}, false},
		{"server not from the CA given", []string{"--redis", byIP, "--redis-tls-cert", cert, "--redis-tls-key", key, "--redis-tls-ca", foreignCAFile}, false},
		{"server not from the system's CAs", []string{"--redis", byIP, "--redis-tls-cert", cert, "--redis-tls-key", key}, false},
		{"host name not in the certificate", []string{"--redis", byName, "--redis-tls-cert", cert, "--redis-tls-key", key, "--redis-tls-ca", caFile}, false},
		{"host name not checked", []string{"--redis", byName, "--redis-tls-cert", cert, "--redis-tls-key", key, "--redis-tls-ca", caFile, "--redis-tls-skip-verify-hostname"}, true},
		{"host name not checked, chain still", []string{"--redis", byName, "--redis-tls-cert", cert, "--redis-tls-key", key, "--redis-tls-ca", foreignCAFile, "--redis-tls-skip-verify-hostname"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			prefix := testkit.KeyPrefix(t)
			args := append([]string{"--config", tlsRules(t), "--redis-prefix", prefix, "--timeout", "5s"}, tc.args...)
			tg := startTollgate(t, "serve", args...)
			once := desc("once", randomID())
			first, second := codesOf(tg.ask(request("tls", once))), codesOf(tg.ask(request("tls", once)))
			if tc.works {
				if got, want := first+" "+second, "OK: OK OVER_LIMIT: OVER_LIMIT"; got != want {
					t.Errorf("two decisions on a limit of 1: %s, want %s", got, want)
				}
				keys, err := rdb.Client(t).Keys(context.Background(), prefix+"*").Result()
				if err != nil {
					t.Fatal(err)
				}
				if len(keys) == 0 {
					t.Errorf("no key under %s in Redis", prefix)
				}
				awaitReady(t, tg, http.StatusOK)
			} else {
				// Failure mode open: the second is allowed too.
				if got, want := first+" "+second, "OK: OK OK: OK"; got != want {
					t.Errorf("two decisions on a limit of 1 without Redis: %s, want %s (failure mode open)", got, want)
				}
				awaitReady(t, tg, http.StatusServiceUnavailable)
				// The reason, at start or on a decision (a loaded machine
				// may time the first out).
				tg.log.waitFor(t, regexp.MustCompile(`level=WARN .*error=".*(tls: |x509: )`), 10*time.Second)
			}
			if got := tg.log.String(); strings.Contains(got, "PRIVATE KEY") {
				t.Errorf("the log holds key material:\n%s", got)
			}
		})
	}
}

// awaitReady waits until /readyz answers want.
func awaitReady(t *testing.T, p *proc, want int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, body := p.get("/readyz")
		if code == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz: %d %s, want %d", code, body, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRedisTLSKinds builds the Redis client of each deployment kind with
// the TLS flags: each presents the client certificate and verifies the
// servers against the CA given, by the URL's host unless told not to.
func TestRedisTLSKinds(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, foreign := newTestCA(t, "redis CA"), newTestCA(t, "foreign CA")
	client := ca.issue(t, "tollgate")
	cert, key := client.files(t, dir, "client")
	caFile := writeCA(t, dir, "ca", ca)
	parse := func(l leaf) *x509.Certificate {
		c, err := x509.ParseCertificate(l.tlsCert(t).Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	byIP := parse(ca.issue(t, "redis", "127.0.0.1"))
	byName := parse(ca.issue(t, "redis", "redis.test"))
	stranger := parse(foreign.issue(t, "redis", "127.0.0.1"))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	for _, tc := range []struct {
		url      string
		skipName bool
		// which of byIP, byName, stranger pass verification
		want string
	}{
		{"rediss://127.0.0.1:6379", false, "byIP"},
		{"rediss://127.0.0.1:6379", true, "byIP byName"},
		{"rediss+sentinel://127.0.0.1:26379?master_name=m&addr=127.0.0.2:26379", false, "byIP"},
		{"rediss+sentinel://127.0.0.1:26379?master_name=m", true, "byIP byName"},
		{"rediss+cluster://127.0.0.1:7000?addr=127.0.0.2:7001", false, "byIP"},
		{"rediss+cluster://127.0.0.1:7000?addr=127.0.0.2:7001", true, "byIP byName"},
	} {
		t.Run(fmt.Sprintf("%s/skip=%v", tc.url, tc.skipName), func(t *testing.T) {
			f := redisTLSFlags{cert: cert, key: key, ca: caFile, skipHostname: tc.skipName}
			opts, err := f.options(tc.url, log, 0)
			if err != nil {
				t.Fatal(err)
			}
			rc, err := redisurl.NewClient(tc.url, opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			var c *tls.Config
			switch rc := rc.(type) {
			case *redis.Client:
				c = rc.Options().TLSConfig
			case *redis.ClusterClient:
				c = rc.Options().TLSConfig
			default:
				t.Fatalf("client %T", rc)
			}
			if c == nil || c.GetClientCertificate == nil || c.VerifyConnection == nil {
				t.Fatalf("TLS config %+v: want a client certificate and a verification", c)
			}
			if got, want := c.MinVersion, uint16(tls.VersionTLS12); got < want {
				t.Errorf("MinVersion %x, want at least %x", got, want)
			}
			got, err := c.GetClientCertificate(&tls.CertificateRequestInfo{})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Certificate[0], client.tlsCert(t).Certificate[0]) {
				t.Errorf("the client certificate presented is not --redis-tls-cert's")
			}
			var passed []string
			for _, s := range []struct {
				name string
				cert *x509.Certificate
			}{{"byIP", byIP}, {"byName", byName}, {"stranger", stranger}} {
				if c.VerifyConnection(tls.ConnectionState{PeerCertificates: []*x509.Certificate{s.cert}}) == nil {
					passed = append(passed, s.name)
				}
			}
			if got := strings.Join(passed, " "); got != tc.want {
				t.Errorf("servers verified: %q, want %q", got, tc.want)
			}
		})
	}
}

// TestRedisTLSPlainURL asks redisurl.NewClient for TLS settings on
// plain URLs: it refuses rather than connect in plain text, without
// quoting the password.
func TestRedisTLSPlainURL(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"redis://:hunter2secret@127.0.0.1:6379",
		"redis+sentinel://127.0.0.1:26379?master_name=m&password=hunter2secret",
		"redis+cluster://:hunter2secret@127.0.0.1:7000",
	} {
		_, err := redisurl.NewClient(u, redisurl.WithTLS(redisurl.TLS{SkipVerifyHostname: true}))
		if err == nil {
			t.Errorf("%s with TLS settings: no error", u)
			continue
		}
		if got, want := err.Error(), "need a rediss:// URL"; !strings.Contains(got, want) || strings.Contains(got, "hunter2secret") {
			t.Errorf("error %q: want it to say %q and hide the password", got, want)
		}
	}
}
