package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// handshakeSerial makes one TLS connection to addr within d and returns
// the serial number of the certificate it was served.
func handshakeSerial(addr string, c *tls.Config, d time.Duration) (int64, error) {
	c = c.Clone()
	if c.NextProtos == nil {
		c.NextProtos = []string{"h2"} // what the gRPC listener wants; the HTTP one takes it too
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: d}, "tcp", addr, c)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64(), nil
}

// rssBytes is the resident memory of process pid, from /proc.
func rssBytes(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no VmRSS in /proc/%d/status", pid)
	}
	kb, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return kb << 10
}

// TestServeTLSFileNotRegular replaces the certificate file under a running
// serve by what no reader should wait on or read to its end — a FIFO,
// then a symbolic link to /dev/zero — and by the real file again in
// between. Every new TLS connection, on HTTP and gRPC, is served at once
// with the certificate that loaded last; the refusal is logged; the real
// file, when it comes back, serves from the next connection on; memory
// stays small; and SIGTERM stops the process within its drain timeout.
func TestServeTLSFileNotRegular(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	cert, key := p.server.files(t, p.dir, "live")
	const drain = 3 * time.Second
	tg := startTollgate(t, "serve", "--config", tlsRules(t), "--drain-timeout", drain.String(),
		"--grpc-tls-cert", cert, "--grpc-tls-key", key, "--http-tls-cert", cert, "--http-tls-key", key)
	addrs := map[string]string{"grpc": tg.grpc, "http": strings.TrimPrefix(tg.http, "http://")}
	c := p.clientTLS(t, nil)
	served := func(when string, want int64) {
		t.Helper()
		for name, addr := range addrs {
			got, err := handshakeSerial(addr, c, 5*time.Second)
			switch {
			case err != nil:
				t.Errorf("%s, %s: TLS handshake: %v", when, name, err)
			case got != want:
				t.Errorf("%s, %s: certificate %d, want %d", when, name, got, want)
			}
		}
	}
	served("at start", p.server.serial)

	// A FIFO in the certificate's place: opening it to read would wait for
	// a writer for ever.
	if err := os.Remove(cert); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(cert, 0o600); err != nil {
		t.Fatal(err)
	}
	served("with a FIFO for the certificate", p.server.serial)
	tg.log.waitFor(t, regexp.MustCompile(`level=WARN msg="the changed TLS files do not load; the previous certificates keep serving".*not a regular file`), 5*time.Second)

	// The real files come back, renewed.
	next := p.ca.issue(t, "tollgate", "localhost", "127.0.0.1")
	replaceFile(t, key, next.keyPEM)
	if err := os.Remove(cert); err != nil {
		t.Fatal(err)
	}
	replaceFile(t, cert, next.certPEM)
	served("with the real file back", next.serial)

	// A symbolic link to /dev/zero: endless, and no regular file either.
	before := rssBytes(t, tg.cmd.Process.Pid)
	if err := os.Remove(cert); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", cert); err != nil {
		t.Fatal(err)
	}
	served("with the certificate a link to /dev/zero", next.serial)
	if after := rssBytes(t, tg.cmd.Process.Pid); after > before+64<<20 {
		t.Errorf("resident memory grew from %d to %d bytes reading /dev/zero", before, after)
	}

	// SIGTERM, with a handshake under way, and a gRPC connection that
	// never sends its TLS hello (the gRPC server waits for it up to
	// --grpc-handshake-timeout, 10 s, longer than the drain).
	go handshakeSerial(addrs["http"], c, 10*time.Second)
	silent, err := net.Dial("tcp", addrs["grpc"])
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	start := time.Now()
	if err := tg.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-tg.exited:
		if took := time.Since(start); took > drain+time.Second {
			t.Errorf("stopped %v after SIGTERM, past the drain timeout of %v", took, drain)
		}
	case <-time.After(drain + 5*time.Second):
		t.Errorf("still running %v after SIGTERM, with a drain timeout of %v", drain+5*time.Second, drain)
	}
	if got := tg.log.String(); strings.Contains(got, "PRIVATE KEY") {
		t.Errorf("the log holds key material:\n%s", got)
	}
}

// TestReadTLSFile reads what may stand in a TLS file's place: only a
// regular file within the bound is read, and nothing blocks.
func TestReadTLSFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.crt")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	zero := filepath.Join(dir, "zero.crt")
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	atLimit, over := filepath.Join(dir, "at-limit.crt"), filepath.Join(dir, "over.crt")
	writeFile(t, atLimit, strings.Repeat("x", tlsMaxFileBytes))
	writeFile(t, over, strings.Repeat("x", tlsMaxFileBytes+1))
	link := filepath.Join(dir, "link.crt")
	if err := os.Symlink(atLimit, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path, want string // want: in the error; "" for none
	}{
		{fifo, "a FIFO, not a regular file"},
		{zero, "a device, not a regular file"},
		{dir, "a directory, not a regular file"},
		{over, "larger than the limit of 1048576 bytes"},
		{filepath.Join(dir, "missing.crt"), "no such file"},
		{atLimit, ""},
		{link, ""},
	} {
		done := make(chan struct{})
		var b []byte
		var err error
		go func() { b, err = readTLSFile("--http-tls-cert", tc.path); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: still reading after 5s", tc.path)
		}
		switch {
		case tc.want == "" && (err != nil || len(b) != tlsMaxFileBytes):
			t.Errorf("%s: %d bytes, %v; want the file", tc.path, len(b), err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "--http-tls-cert")):
			t.Errorf("%s: error %v, want one starting with the flag and saying %q", tc.path, err, tc.want)
		}
	}
}

// TestReloaderReadHangs gives a reloader files whose read never ends: get
// waits at most its wait for it, then serves what it had; a further change
// starts a new read, whose result is taken; the hung read's is not.
func TestReloaderReadHangs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	f := filepath.Join(dir, "f")
	writeFile(t, f, "1")
	hang := make(chan struct{})
	defer close(hang)
	log := &logBuffer{added: make(chan struct{}, 1)}
	r, err := newReloader("test TLS", []string{f}, func() (string, error) {
		b, err := os.ReadFile(f)
		switch string(b) {
		case "hang":
			<-hang
			return "from the hung read", nil
		case "bad":
			return "", errors.New("does not load")
		}
		return string(b), err
	}, slog.New(slog.NewTextHandler(log, nil)), 0)
	if err != nil {
		t.Fatal(err)
	}
	r.wait = 200 * time.Millisecond
	if got := r.get(); got != "1" {
		t.Fatalf("get = %q, want 1", got)
	}
	replaceFile(t, f, []byte("hang"))
	for i := range 3 {
		start := time.Now()
		if got := r.get(); got != "1" {
			t.Errorf("get %d while the read hangs = %q, want 1", i, got)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("get %d took %v, want at most the wait", i, took)
		}
	}
	replaceFile(t, f, []byte("2"))
	if got := r.get(); got != "2" {
		t.Errorf("get after a new change = %q, want 2", got)
	}
	if !strings.Contains(log.String(), "not read yet") {
		t.Errorf("the hung read is not logged:\n%s", log.String())
	}
	replaceFile(t, f, []byte("bad"))
	if got := r.get(); got != "2" {
		t.Errorf("get after a change that does not load = %q, want 2", got)
	}
}
