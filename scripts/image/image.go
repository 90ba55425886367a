package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"debug/buildinfo"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image is one layer on nothing: the static binary at /bin/tollgate,
// /bin/ratelimit a link to it (envoyproxy/ratelimit's path, which Envoy
// Gateway and Istio's sample run as the container's command), /etc/passwd
// and /etc/group naming the one user it runs as, and an empty /tmp. No
// shell, no libc, no CA bundle: TLS is checked against the CA files the
// flags or variables name, else against the roots built into the binary
// (cmd/tollgate/roots.go).
const (
	// uid and gid are the numeric user the image runs as (not root, and
	// numeric so that Kubernetes' runAsNonRoot can check it without a
	// passwd lookup). 65532 is the "nonroot" of distroless images.
	uid = 65532
	gid = 65532
)

// envoyPorts are envoyproxy/ratelimit's ports, which tollgate serve takes
// in envoy mode: HTTP (/json, /healthcheck, /metrics), gRPC, debug.
var envoyPorts = []string{"8080/tcp", "8081/tcp", "6070/tcp"}

// options say what to build.
type options struct {
	root     string    // the module's directory
	arch     string    // GOARCH of the image (its OS is linux)
	buildVCS string    // go build's -buildvcs: auto stamps the commit from a git checkout
	created  time.Time // every timestamp in the image
}

// buildImage builds tollgate for linux and wraps it in the image. The
// same commit, toolchain and options give the same bytes: go build with
// -trimpath and an empty build ID is reproducible, and every timestamp,
// owner and mode in the layer and the config is fixed.
func buildImage(ctx context.Context, o options) (v1.Image, error) {
	bin, err := goBuild(ctx, o)
	if err != nil {
		return nil, err
	}
	layerTar, err := rootfs(bin, o.created)
	if err != nil {
		return nil, err
	}
	// Compressed here, once: the layer's digest, size and contents all read
	// these bytes, where a layer given the tar would compress it for each.
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if _, err := zw.Write(layerTar); err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gz.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	cfg := &v1.ConfigFile{
		Architecture: o.arch,
		OS:           "linux",
		Created:      v1.Time{Time: o.created},
		RootFS:       v1.RootFS{Type: "layers"},
		Config: v1.Config{
			User:         fmt.Sprintf("%d:%d", uid, gid),
			Entrypoint:   []string{"/bin/tollgate", "serve"},
			Env:          []string{"PATH=/bin"},
			WorkingDir:   "/",
			ExposedPorts: map[string]struct{}{},
			Labels:       labels(bin),
		},
	}
	for _, p := range envoyPorts {
		cfg.Config.ExposedPorts[p] = struct{}{}
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return nil, fmt.Errorf("image: config: %w", err)
	}
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: o.created}, CreatedBy: "make image (scripts/image)", Comment: "tollgate, static, as /bin/tollgate and /bin/ratelimit"},
	})
	if err != nil {
		return nil, fmt.Errorf("image: append layer: %w", err)
	}
	return img, nil
}

// goBuild builds ./cmd/tollgate as a static linux binary and returns it.
func goBuild(ctx context.Context, o options) ([]byte, error) {
	dir, err := os.MkdirTemp("", "tollgate-image-")
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "tollgate")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs="+o.buildVCS,
		"-ldflags=-s -w -buildid=", "-o", out, "./cmd/tollgate")
	cmd.Dir = o.root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+o.arch)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("image: go build: %w\n%s", err, msg)
	}
	bin, err := os.ReadFile(out)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	return bin, nil
}

// rootfs is the layer's uncompressed tar.
func rootfs(bin []byte, mtime time.Time) ([]byte, error) {
	passwd := fmt.Sprintf("root:x:0:0:root:/:/sbin/nologin\ntollgate:x:%d:%d:tollgate:/:/sbin/nologin\n", uid, gid)
	group := fmt.Sprintf("root:x:0:\ntollgate:x:%d:\n", gid)
	entries := []struct {
		hdr  tar.Header
		body []byte
	}{
		{tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755}, nil},
		{tar.Header{Name: "bin/tollgate", Typeflag: tar.TypeReg, Mode: 0o755}, bin},
		{tar.Header{Name: "bin/ratelimit", Typeflag: tar.TypeSymlink, Linkname: "tollgate", Mode: 0o777}, nil},
		{tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755}, nil},
		{tar.Header{Name: "etc/group", Typeflag: tar.TypeReg, Mode: 0o644}, []byte(group)},
		{tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644}, []byte(passwd)},
		{tar.Header{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777}, nil},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		h.Size = int64(len(e.body))
		h.ModTime = mtime
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			return nil, fmt.Errorf("image: layer %s: %w", h.Name, err)
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, fmt.Errorf("image: layer %s: %w", h.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	return buf.Bytes(), nil
}

// labels are the OCI annotations of the image config, read from the
// binary's own build information.
func labels(bin []byte) map[string]string {
	l := map[string]string{
		"org.opencontainers.image.title":       "tollgate",
		"org.opencontainers.image.description": "tollgate serve: a rate limit service for Envoy, Envoy Gateway, Istio and nginx; also at envoyproxy/ratelimit's /bin/ratelimit",
		"org.opencontainers.image.source":      "https://github.com/tollgate/tollgate",
	}
	bi, err := buildinfo.Read(bytes.NewReader(bin))
	if err != nil {
		return l
	}
	l["org.opencontainers.image.version"] = bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			l["org.opencontainers.image.revision"] = s.Value
		}
	}
	return l
}

// sourceDate is the image's timestamp: SOURCE_DATE_EPOCH (seconds since
// 1970, as reproducible builds define it) when set, else the epoch.
func sourceDate(getenv func(string) string) (time.Time, error) {
	v := strings.TrimSpace(getenv("SOURCE_DATE_EPOCH"))
	if v == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	secs, err := strconv.ParseInt(v, 10, 64)
	if err != nil || secs < 0 {
		return time.Time{}, fmt.Errorf("image: SOURCE_DATE_EPOCH=%q: want whole seconds since 1970", v)
	}
	return time.Unix(secs, 0).UTC(), nil
}
