// Command image builds tollgate's container image without a container
// daemon (make image): a static tollgate for linux in one layer, run as a
// non-root user, with envoyproxy/ratelimit's path and ports, so that it
// can take the place of envoyproxy/ratelimit's image where a Deployment
// names that image (docs/migrating.md).
//
// It writes a tarball that `docker load` and `podman load` read (-o) and,
// with -oci, an OCI image layout directory for registries and tools that
// copy from one (skopeo copy oci:DIR, crane push DIR). Two builds of one
// commit with one toolchain give the same digest: every timestamp in the
// image is SOURCE_DATE_EPOCH, or 1970 when it is unset.
//
//	go run ./scripts/image -o bin/tollgate-image.tar -oci bin/tollgate-oci -tag tollgate:dev
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "bin/tollgate-image.tar", "the tarball to write, for docker load and podman load")
	oci := fs.String("oci", "", "also write an OCI image layout into this directory (replaced)")
	tag := fs.String("tag", "tollgate:latest", "the name docker load and podman load give the image")
	arch := fs.String("arch", runtime.GOARCH, "the image's architecture (GOARCH); its OS is linux")
	vcs := fs.String("buildvcs", "auto", "go build's -buildvcs: auto records the commit when built in a git checkout")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "image: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	ref, err := name.NewTag(*tag)
	if err != nil {
		fmt.Fprintf(stderr, "image: -tag %q: %v\n", *tag, err)
		return 2
	}
	created, err := sourceDate(getenv)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	root, err := moduleRoot(ctx)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if err := write(ctx, options{root: root, arch: *arch, buildVCS: *vcs, created: created}, ref, *out, *oci, stdout); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// write builds the image and writes the tarball and the layout.
func write(ctx context.Context, o options, ref name.Tag, out, oci string, stdout io.Writer) error {
	img, err := buildImage(ctx, o)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if err := tarball.WriteToFile(out, ref, img); err != nil {
		return fmt.Errorf("image: write %s: %w", out, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("image: digest: %w", err)
	}
	fmt.Fprintf(stdout, "%s: %s %s\n", out, ref, digest)
	if oci == "" {
		return nil
	}
	if err := os.RemoveAll(oci); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	p, err := layout.Write(oci, empty.Index)
	if err != nil {
		return fmt.Errorf("image: write %s: %w", oci, err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref.TagStr()})); err != nil {
		return fmt.Errorf("image: write %s: %w", oci, err)
	}
	fmt.Fprintf(stdout, "%s: %s %s\n", oci, ref, digest)
	return nil
}

// moduleRoot is the directory of the module being built (go env GOMOD).
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("image: go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("image: run from tollgate's module (no go.mod here)")
	}
	return filepath.Dir(gomod), nil
}
