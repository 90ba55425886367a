//go:build linux

package test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"

	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
)

// TestChartRuns runs the rendered container as the kubelet would: the
// image's entrypoint (tollgate serve) with the rendered arguments, the
// environment resolved from the Secrets, and each volume laid out as the
// kubelet lays it out in a directory of its own (the ConfigMap through its
// ..data symlinks). Only the listeners move to loopback. It checks the
// probes, that the Redis password from the Secret is used, mTLS on gRPC,
// and that a change of the ConfigMap reaches the rules without a restart.
func TestChartRuns(t *testing.T) {
	redis := redistest.NewServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Set after start: redistest checks the server with a PING of its own.
	if err := redis.Client(t).ConfigSet(ctx, "requirepass", "s3cret-pw").Err(); err != nil {
		t.Fatal(err)
	}
	o := mustRender(t, map[string]any{
		"redis": redisSecret("tollgate-redis"),
		"tls":   map[string]any{"secretName": "tollgate-tls", "clientCA": true},
	})
	secrets := map[string]map[string]string{"tollgate-redis": {"url": redis.URL(), "password": "s3cret-pw"}}
	c := container(t, o.deploy)

	// The volumes, each in a directory standing for its mount path.
	mounts := map[string]string{}
	var rules *testkit.ConfigMap
	var clientTLS *tls.Config
	for _, m := range c.VolumeMounts {
		dir := t.TempDir()
		mounts[m.MountPath] = dir
		switch v := volume(t, o.deploy, m.Name); {
		case v.ConfigMap != nil && v.ConfigMap.Name == o.configMap.Name:
			rules = &testkit.ConfigMap{Dir: dir}
			rules.Update(t, o.configMap.Data)
		case v.Secret != nil && v.Secret.SecretName == "tollgate-tls":
			clientTLS = testkit.TLSSecret(t, dir)
		default:
			t.Fatalf("volume %s: %+v, not one this test lays out", m.Name, v.VolumeSource)
		}
	}
	if rules == nil || clientTLS == nil {
		t.Fatalf("mounts %v: want the rules and the TLS Secret", mounts)
	}
	args := []string{"serve"} // the image's entrypoint: /bin/tollgate serve
	for _, a := range c.Args {
		switch a {
		case "--http=:8080":
			a = "--http=127.0.0.1:0"
		case "--grpc=:8081":
			a = "--grpc=127.0.0.1:0"
		}
		for path, dir := range mounts {
			if flag, v, ok := strings.Cut(a, "="); ok && (v == path || strings.HasPrefix(v, path+"/")) {
				a = flag + "=" + dir + strings.TrimPrefix(v, path)
			}
		}
		args = append(args, a)
	}
	p := start(t, tollgate(t), args, resolveEnv(t, c.Env, secrets))

	// The probes, as the kubelet repeats them: /readyz follows a Redis
	// ping made every second.
	for _, probe := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
		code, body := 0, ""
		for deadline := time.Now().Add(5 * time.Second); code != http.StatusOK && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			code, body = httpDo(t, "GET", "http://"+p.http+probe.HTTPGet.Path, "")
		}
		if code != http.StatusOK {
			t.Errorf("probe %s: %d %s, want 200 (Redis with the Secret's password)\n%s", probe.HTTPGet.Path, code, body, p.log.String())
		}
	}

	// gRPC over mTLS: served with the Secret's certificate, and refused to
	// a client without one.
	codes := func(cfg *tls.Config) (pb.RateLimitResponse_Code, error) {
		conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "edge",
			Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}}}}})
		return resp.GetOverallCode(), err
	}
	if code, err := codes(clientTLS); err != nil || code != pb.RateLimitResponse_OK {
		t.Errorf("ShouldRateLimit with a client certificate: %v %v, want OK", code, err)
	}
	noCert := clientTLS.Clone()
	noCert.Certificates = nil
	if _, err := codes(noCert); err == nil {
		t.Errorf("ShouldRateLimit without a client certificate: served, want refused (tls.clientCA)")
	}

	// A new version of the ConfigMap, swapped in as the kubelet does.
	rules.Update(t, map[string]string{"rules.yaml": "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 3\n"})
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, body := httpDo(t, "POST", "http://"+p.http+"/json", `{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.2"}]}]}`)
		var answer struct {
			Statuses []struct{ CurrentLimit struct{ RequestsPerUnit int } }
		}
		if err := json.Unmarshal([]byte(body), &answer); err != nil {
			t.Fatalf("/json: %v: %s", err, body)
		}
		if len(answer.Statuses) == 1 && answer.Statuses[0].CurrentLimit.RequestsPerUnit == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ConfigMap's new rules are not in force after 10s: /json says %s\n%s", body, p.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if strings.Contains(p.log.String(), "s3cret-pw") {
		t.Errorf("the Redis password is in the log:\n%s", p.log.String())
	}
}

// resolveEnv is the container's environment as the kubelet sets it: values
// as they are, Secret keys looked up (an optional one may be missing), and
// nothing else.
func resolveEnv(t *testing.T, env []corev1.EnvVar, secrets map[string]map[string]string) []string {
	t.Helper()
	var out []string
	for _, e := range env {
		switch ref := e.ValueFrom; {
		case ref == nil:
			out = append(out, e.Name+"="+e.Value)
		case ref.SecretKeyRef != nil:
			v, ok := secrets[ref.SecretKeyRef.Name][ref.SecretKeyRef.Key]
			if !ok && (ref.SecretKeyRef.Optional == nil || !*ref.SecretKeyRef.Optional) {
				t.Fatalf("%s: no key %s in the Secret %s", e.Name, ref.SecretKeyRef.Key, ref.SecretKeyRef.Name)
			}
			if ok {
				out = append(out, e.Name+"="+v)
			}
		default:
			t.Fatalf("%s: a value from %+v, which this test does not resolve", e.Name, ref)
		}
	}
	return out
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// tollgate builds the binary in tollgate's own module, with its go.mod
// (not this module's, which has Helm's requirements too).
func tollgate(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tollgate-chart-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "tollgate")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/tollgate")
		cmd.Dir = filepath.Join("..", "..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = err
			t.Logf("go build: %s", out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

type proc struct {
	http, grpc string
	log        *syncBuffer
}

// The chart sets --log-format=json.
var listening = regexp.MustCompile(`"msg":"listening","http":"([^"]+)","grpc":"([^"]+)"`)

// start runs bin with args and exactly env, waits until it listens, and
// stops it when the test ends.
func start(t *testing.T, bin string, args, env []string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
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
		case <-time.After(30 * time.Second):
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
			t.Fatalf("tollgate %q exited: %v\n%s", args, err, log.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("tollgate %q does not listen after 20s:\n%s", args, log.String())
	return nil
}

func httpDo(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

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
