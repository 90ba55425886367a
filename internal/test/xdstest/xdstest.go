// Package xdstest runs a real xDS management server for tests: Envoy's
// go-control-plane, its SotW server and snapshot cache, as Envoy Gateway
// runs them to push rate limit rules, on a free loopback port, over mTLS
// with certificates the test makes (Certs) or in plaintext. It records
// what clients send — ACKs, NACKs and their messages, the stream's
// headers — for tests to assert on.
package xdstest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
)

// Certs are PEM files of one certificate authority and of a server and a
// client certificate it issued, for 127.0.0.1 and localhost, as Envoy
// Gateway's certgen makes them for its xDS server and the rate limit
// service.
type Certs struct {
	CA                    string
	ServerCert, ServerKey string
	ClientCert, ClientKey string
	ServerName            string // a DNS name the server certificate holds beside 127.0.0.1
	caCert                *x509.Certificate
	caKey                 *ecdsa.PrivateKey
}

// NewCerts writes a CA and the two certificates into a directory of the
// test's.
func NewCerts(t testing.TB) *Certs {
	t.Helper()
	dir := t.TempDir()
	c := &Certs{CA: filepath.Join(dir, "ca.crt"), ServerName: "envoy-gateway.test"}
	c.caKey = newKey(t)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "xdstest CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &c.caKey.PublicKey, c.caKey)
	if err != nil {
		t.Fatal(err)
	}
	if c.caCert, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	writePEM(t, c.CA, "CERTIFICATE", der)
	c.ServerCert, c.ServerKey = c.issue(t, dir, "server", 2, c.ServerName)
	c.ClientCert, c.ClientKey = c.issue(t, dir, "client", 3, "envoy-ratelimit")
	return c
}

func (c *Certs) issue(t testing.TB, dir, name string, serial int64, dns string) (certFile, keyFile string) {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: dns},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames: []string{dns, "localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.caCert, &key.PublicKey, c.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kder)
	return certFile, keyFile
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// serverTLS is the server's side of mTLS: its certificate, and client
// certificates of the CA required.
func (c *Certs) serverTLS(t testing.TB) *tls.Config {
	t.Helper()
	kp, err := tls.LoadX509KeyPair(c.ServerCert, c.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(c.caCert)
	return &tls.Config{Certificates: []tls.Certificate{kp}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
}

// Request is what a client sent on a stream: an ACK (Error empty) or a
// NACK of the response of Nonce.
type Request struct {
	Version, Nonce, Error string
	Node                  *core.Node
}

// Server is a management server that keeps one snapshot per node id.
type Server struct {
	Addr  string
	certs *Certs

	mu       sync.Mutex
	cache    cache.SnapshotCache
	grpc     *grpc.Server
	requests []Request
	headers  metadata.MD // of the last stream opened
	streams  int
}

// Start starts a server on a free loopback port, over mTLS with certs (nil:
// plaintext). It stops when the test ends.
func Start(t testing.TB, certs *Certs) *Server {
	t.Helper()
	s := &Server{certs: certs}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Addr = l.Addr().String()
	s.serve(t, l)
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) serve(t testing.TB, l net.Listener) {
	t.Helper()
	var opts []grpc.ServerOption
	if s.certs != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.certs.serverTLS(t))))
	}
	c := cache.NewSnapshotCache(false, cache.IDHash{}, nil)
	cb := serverv3.CallbackFuncs{
		StreamOpenFunc: func(ctx context.Context, _ int64, _ string) error {
			md, _ := metadata.FromIncomingContext(ctx)
			s.mu.Lock()
			s.headers, s.streams = md, s.streams+1
			s.mu.Unlock()
			return nil
		},
		StreamRequestFunc: func(_ int64, r *discovery.DiscoveryRequest) error {
			s.mu.Lock()
			s.requests = append(s.requests, Request{Version: r.GetVersionInfo(), Nonce: r.GetResponseNonce(), Error: r.GetErrorDetail().GetMessage(), Node: r.GetNode()})
			s.mu.Unlock()
			return nil
		},
	}
	g := grpc.NewServer(opts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(context.Background(), c, cb))
	s.mu.Lock()
	s.cache, s.grpc, s.streams = c, g, 0
	s.mu.Unlock()
	go g.Serve(l)
}

// Push sets node's snapshot: version, and configs as its RateLimitConfig
// resources, the whole set.
func (s *Server) Push(t testing.TB, node, version string, configs ...*rlsconf.RateLimitConfig) {
	t.Helper()
	rs := make([]types.Resource, len(configs))
	for i, c := range configs {
		rs[i] = c
	}
	snap, err := cache.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: rs})
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	c := s.cache
	s.mu.Unlock()
	if err := c.SetSnapshot(context.Background(), node, snap); err != nil {
		t.Fatal(err)
	}
}

// Stop stops the server, closing its streams.
func (s *Server) Stop() {
	s.mu.Lock()
	g := s.grpc
	s.mu.Unlock()
	g.Stop()
}

// Restart stops the server and starts a new one on the same address with
// an empty cache, as a restarted Envoy Gateway is: no snapshot until the
// next Push, which numbers its versions from "1" again.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	var l net.Listener
	var err error
	for range 100 { // the old listener's port may take a moment to come free
		if l, err = net.Listen("tcp", s.Addr); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	s.serve(t, l)
}

// Requests returns what the clients sent so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Headers returns the metadata of the last stream opened, and how many
// streams were opened since the server last started.
func (s *Server) Headers() (metadata.MD, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.headers, s.streams
}
