//go:build linux

package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
)

// TestImage builds the image twice as make image does, checks that both
// builds are the same bytes, then unpacks its layers into a directory and
// runs tollgate from there: as Envoy Gateway runs envoyproxy/ratelimit's
// image, and by the image's own entrypoint.
func TestImage(t *testing.T) {
	dir := t.TempDir()
	var digests []string
	var sums [][32]byte
	for i := range 2 {
		tarPath, ociPath := filepath.Join(dir, fmt.Sprint(i, ".tar")), filepath.Join(dir, fmt.Sprint(i, "-oci"))
		// As make image runs it: go run, outside the race detector that
		// slows compression here twentyfold. The commit is not recorded
		// (-buildvcs=false): tests of other packages running meanwhile may
		// add files to the tree, which would flip the "modified" flag
		// between the two builds.
		cmd := exec.Command("go", "run", ".", "-o", tarPath, "-oci", ociPath, "-tag", "tollgate:test", "-buildvcs=false")
		cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=1764547200")
		var errb bytes.Buffer
		cmd.Stderr = &errb
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("build %d: %v\n%s", i, err, errb.String())
		}
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(tarPath) + `: tollgate:test (sha256:[0-9a-f]{64})$`).FindSubmatch(out)
		if m == nil {
			t.Fatalf("build %d printed %q, want the tarball, the tag and the digest", i, out)
		}
		digests = append(digests, string(m[1]))
		data, err := os.ReadFile(tarPath)
		if err != nil {
			t.Fatal(err)
		}
		sums = append(sums, sha256.Sum256(data))
	}
	if digests[0] != digests[1] || sums[0] != sums[1] {
		t.Fatalf("two builds differ: digests %s and %s, tarballs %x and %x", digests[0], digests[1], sums[0], sums[1])
	}

	img := fromLayout(t, filepath.Join(dir, "0-oci"), digests[0])
	checkTarball(t, filepath.Join(dir, "0.tar"), img)
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	checkConfig(t, cfg)
	root := filepath.Join(dir, "rootfs")
	unpack(t, img, root)
	checkRootfs(t, root)

	t.Run("Envoy Gateway v1.0-v1.1", func(t *testing.T) { runAsEnvoyGateway(t, root) })
	t.Run("entrypoint with flags", func(t *testing.T) { runEntrypoint(t, root, cfg.Config.Entrypoint) })
}

// fromLayout reads the image back from the OCI layout, by its digest.
func fromLayout(t *testing.T, dir, digest string) v1.Image {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	h, err := v1.NewHash(digest)
	if err != nil {
		t.Fatal(err)
	}
	img, err := p.Image(h)
	if err != nil {
		t.Fatalf("the OCI layout has no image %s: %v", digest, err)
	}
	return img
}

// checkTarball reads the docker load tarball back and finds the same
// config and layers as in the layout.
func checkTarball(t *testing.T, path string, want v1.Image) {
	t.Helper()
	img, err := tarball.ImageFromPath(path, nil)
	if err != nil {
		t.Fatalf("tarball: %v", err)
	}
	gotCfg, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	wantCfg, _ := want.ConfigName()
	if gotCfg != wantCfg {
		t.Errorf("tarball config %s, layout config %s", gotCfg, wantCfg)
	}
	gotLayers, _ := img.Layers()
	wantLayers, _ := want.Layers()
	if len(gotLayers) != len(wantLayers) || len(gotLayers) != 1 {
		t.Fatalf("tarball has %d layers, layout %d: want one", len(gotLayers), len(wantLayers))
	}
	g, _ := gotLayers[0].Digest()
	w, _ := wantLayers[0].Digest()
	if g != w {
		t.Errorf("tarball layer %s, layout layer %s", g, w)
	}
}

func checkConfig(t *testing.T, cfg *v1.ConfigFile) {
	t.Helper()
	c := cfg.Config
	if got, want := c.User, "65532:65532"; got != want {
		t.Errorf("User = %q, want %q (numeric, not root)", got, want)
	}
	if got, want := c.Entrypoint, []string{"/bin/tollgate", "serve"}; !slices.Equal(got, want) {
		t.Errorf("Entrypoint = %q, want %q", got, want)
	}
	var ports []string
	for p := range c.ExposedPorts {
		ports = append(ports, p)
	}
	slices.Sort(ports)
	if got, want := ports, []string{"6070/tcp", "8080/tcp", "8081/tcp"}; !slices.Equal(got, want) {
		t.Errorf("ExposedPorts = %q, want envoy's %q", got, want)
	}
	if got, want := cfg.Created.Time, time.Unix(1764547200, 0); !got.Equal(want) {
		t.Errorf("Created = %s, want SOURCE_DATE_EPOCH %s", got, want)
	}
	if cfg.RootFS.Type != "layers" || len(cfg.RootFS.DiffIDs) != 1 {
		t.Errorf("rootfs %+v, want type layers (as the OCI image spec requires) and one layer", cfg.RootFS)
	}
	if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cfg.OS, cfg.Architecture, runtime.GOARCH)
	}
}

// unpack extracts every layer into root, as a container runtime lays out
// the image's filesystem.
func unpack(t *testing.T, img v1.Image, root string) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if !filepath.IsLocal(h.Name) {
				t.Fatalf("layer entry %q leaves the root", h.Name)
			}
			if !h.ModTime.Equal(time.Unix(1764547200, 0)) || h.Uid != 0 || h.Gid != 0 {
				t.Errorf("%s: mtime %s, owner %d:%d; want SOURCE_DATE_EPOCH, root", h.Name, h.ModTime, h.Uid, h.Gid)
			}
			p := filepath.Join(root, h.Name)
			switch h.Typeflag {
			case tar.TypeDir:
				err = os.MkdirAll(p, h.FileInfo().Mode().Perm())
			case tar.TypeSymlink:
				err = os.Symlink(h.Linkname, p)
			case tar.TypeReg:
				var data []byte
				if data, err = io.ReadAll(tr); err == nil {
					err = os.WriteFile(p, data, h.FileInfo().Mode().Perm())
				}
			default:
				t.Fatalf("layer entry %q: unexpected type %c", h.Name, h.Typeflag)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		rc.Close()
	}
}

func checkRootfs(t *testing.T, root string) {
	t.Helper()
	if got, err := os.Readlink(filepath.Join(root, "bin", "ratelimit")); err != nil || got != "tollgate" {
		t.Errorf("/bin/ratelimit: link to %q (%v), want tollgate", got, err)
	}
	f, err := elf.Open(filepath.Join(root, "bin", "tollgate"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("/bin/tollgate is dynamically linked (%s): want a static binary", p.Type)
		}
	}
	// No CA bundle in the image: the binary carries its own roots, used
	// where the system has none (rediss:// to a publicly signed Redis).
	bi, err := buildinfo.ReadFile(filepath.Join(root, "bin", "tollgate"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(bi.Deps, func(m *debug.Module) bool { return m.Path == "golang.org/x/crypto/x509roots/fallback" }) {
		t.Errorf("/bin/tollgate is built without golang.org/x/crypto/x509roots/fallback: no TLS roots in the image")
	}
	passwd, err := os.ReadFile(filepath.Join(root, "etc", "passwd"))
	if err != nil || !strings.Contains(string(passwd), ":65532:65532:") {
		t.Errorf("/etc/passwd: %q (%v), want the user 65532", passwd, err)
	}
}

// The rules, in the shape Envoy Gateway gives them: a domain named after
// the listener, the route as key and value, and the limit on the rule's
// match, with no value. The window is an hour, so that a window boundary
// between the three requests below, milliseconds apart, is all but
// impossible.
const egRules = `domain: default/eg/http
descriptors:
  - key: httproute/default/ratelimit/rule/0
    value: httproute/default/ratelimit/rule/0
    descriptors:
      - key: rule-0-match-0
        rate_limit:
          unit: hour
          requests_per_unit: 2
`

// runAsEnvoyGateway runs /bin/ratelimit from the unpacked image with the
// environment of the Deployment Envoy Gateway v1.0 and v1.1 create
// (internal/infrastructure/kubernetes/ratelimit of envoyproxy/gateway), on
// loopback ports and with temporary paths for the certificates and rules.
func runAsEnvoyGateway(t *testing.T, root string) {
	redis := redistest.NewServer(t)
	data := t.TempDir()
	writeFile(t, filepath.Join(data, "ratelimit", "config", "rules.yaml"), egRules)
	certs := t.TempDir()
	clientTLS := testkit.TLSSecret(t, certs)
	env := []string{
		"RUNTIME_ROOT=" + data,
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"RUNTIME_IGNOREDOTFILES=true",
		"RUNTIME_WATCH_ROOT=false",
		"LOG_LEVEL=info",
		// Envoy Gateway also sets USE_STATSD=true with STATSD_PORT=9125 (its
		// statsd-exporter sidecar) and takes the rules over xDS
		// (CONFIG_TYPE=GRPC_XDS_SOTW, CONFIG_GRPC_XDS_*,
		// FORCE_START_WITHOUT_INITIAL_CONFIG=true). Those need a statsd
		// server and a management server, and cmd/tollgate's tests run
		// them with the binary (TestStatsd*, TestEnvoyGateway);
		// this one is about the image, so its rules come from RUNTIME_ROOT
		// and statsd, on by default as in envoy, is turned off.
		"USE_STATSD=false",
		"GRPC_SERVER_USE_TLS=true",
		"GRPC_SERVER_TLS_CERT=" + filepath.Join(certs, "tls.crt"),
		"GRPC_SERVER_TLS_KEY=" + filepath.Join(certs, "tls.key"),
		"GRPC_SERVER_TLS_CA_CERT=" + filepath.Join(certs, "ca.crt"),
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_URL=" + redis.Addr(),
		// Loopback, and ports of the system's choosing, for 8080, 8081, 6070.
		"HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0",
	}
	p := start(t, []string{filepath.Join(root, "bin", "ratelimit")}, env)
	// Envoy Gateway's startup and readiness probes.
	if code := get(t, "http://"+p.http+"/healthcheck"); code != http.StatusOK {
		t.Errorf("/healthcheck: %d, want 200", code)
	}
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := pb.NewRateLimitServiceClient(conn)
	req := &pb.RateLimitRequest{Domain: "default/eg/http", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{
		{Key: "httproute/default/ratelimit/rule/0", Value: "httproute/default/ratelimit/rule/0"},
		{Key: "rule-0-match-0", Value: "rule-0-match-0"},
	}}}}
	var codes []pb.RateLimitResponse_Code
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := rls.ShouldRateLimit(ctx, req)
		cancel()
		if err != nil {
			t.Fatalf("ShouldRateLimit over TLS: %v\n%s", err, p.log.String())
		}
		codes = append(codes, resp.OverallCode)
	}
	if want := []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT}; !slices.Equal(codes, want) {
		t.Errorf("three requests against 2 an hour: %v, want %v", codes, want)
	}
	if !strings.Contains(p.log.String(), "store=redis") {
		t.Errorf("not deciding with Redis:\n%s", p.log.String())
	}
}

// runEntrypoint runs the image's entrypoint with flags, as a Deployment of
// tollgate's own (deploy/helm) gives them.
func runEntrypoint(t *testing.T, root string, entrypoint []string) {
	rules := t.TempDir()
	writeFile(t, filepath.Join(rules, "rules.yaml"), egRules)
	argv := append([]string{filepath.Join(root, entrypoint[0])}, entrypoint[1:]...)
	argv = append(argv, "--config", rules, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0")
	p := start(t, argv, nil)
	for _, path := range []string{"/healthcheck", "/readyz"} {
		if code := get(t, "http://"+p.http+path); code != http.StatusOK {
			t.Errorf("%s: %d, want 200", path, code)
		}
	}
}

// proc is tollgate running from the unpacked image.
type proc struct {
	http, grpc string
	log        *syncBuffer
}

var listening = regexp.MustCompile(`msg=listening http=(\S+) grpc=(\S+)`)

// start runs argv with exactly env (nothing inherited, as in a container),
// waits until it listens, and stops it when the test ends.
func start(t *testing.T, argv, env []string) *proc {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Dir = "/"
	log := new(syncBuffer)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if m := listening.FindStringSubmatch(log.String()); m != nil {
			return &proc{http: m[1], grpc: m[2], log: log}
		}
		select {
		case err := <-done:
			t.Fatalf("%s exited: %v\n%s", argv[0], err, log.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("%s does not listen after 20s:\n%s", argv[0], log.String())
	return nil
}

func get(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// syncBuffer is a process's output, read while it is written.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
