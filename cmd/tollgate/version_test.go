package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionText(t *testing.T) {
	vcs := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	plat := runtime.GOOS + "/" + runtime.GOARCH
	tests := []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"no build info", nil, "tollgate unknown (built without module information)\n"},
		{"go install of a version", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/tollgate/tollgate", Version: "v1.2.3"}},
			"tollgate v1.2.3\nmodule   github.com/tollgate/tollgate\ncommit   unknown (built outside a git checkout, or with -buildvcs=false)\ngo       go1.26.8 " + plat + "\n"},
		{"go build in a clean checkout", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/tollgate/tollgate", Version: "v0.0.0-20261201101505-6ed557d0a1b2"},
			Settings: vcs("vcs", "git", "vcs.revision", "6ed557d0a1b2c3d4e5f60718293a4b5c6d7e8f90", "vcs.time", "2026-12-01T10:15:05Z", "vcs.modified", "false")},
			"tollgate v0.0.0-20261201101505-6ed557d0a1b2\nmodule   github.com/tollgate/tollgate\ncommit   6ed557d0a1b2c3d4e5f60718293a4b5c6d7e8f90 2026-12-01T10:15:05Z\ngo       go1.26.8 " + plat + "\n"},
		{"go build in a modified checkout", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/tollgate/tollgate", Version: "v0.0.0-20261201101505-6ed557d0a1b2+dirty"},
			Settings: vcs("vcs.revision", "6ed557d0a1b2c3d4e5f60718293a4b5c6d7e8f90", "vcs.modified", "true")},
			"tollgate v0.0.0-20261201101505-6ed557d0a1b2+dirty\nmodule   github.com/tollgate/tollgate\ncommit   6ed557d0a1b2c3d4e5f60718293a4b5c6d7e8f90 (modified)\ngo       go1.26.8 " + plat + "\n"},
		{"no version stamped", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/tollgate/tollgate"}},
			"tollgate (devel)\nmodule   github.com/tollgate/tollgate\ncommit   unknown (built outside a git checkout, or with -buildvcs=false)\ngo       go1.26.8 " + plat + "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := versionText(tc.bi); got != tc.want {
				t.Errorf("versionText:\ngot  %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestVersionTakesNoArguments(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"tollgate", "version", "extra"}, func(string) string { return "" }, &out, &errb); code != 2 {
		t.Errorf("exit code = %d, want 2", code)
	}
	if out.Len() != 0 || !strings.Contains(errb.String(), "takes no arguments") {
		t.Errorf("stdout %q, stderr %q: want nothing, and the refusal", out.String(), errb.String())
	}
}

// TestVersionBinary runs `tollgate version` on the built binary and checks
// it against what the Go toolchain reads from the same file.
func TestVersionBinary(t *testing.T) {
	bin := tollgateBinary(t)
	got := runOut(t, "", nil, bin, "version")
	meta := runOut(t, "", nil, "go", "version", "-m", bin)
	goVersion := strings.TrimSpace(meta[strings.Index(meta, ":")+1 : strings.Index(meta, "\n")])
	var modVersion string
	for _, line := range strings.Split(meta, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "mod" && f[1] == "github.com/tollgate/tollgate" {
			modVersion = f[2]
		}
	}
	for _, want := range []string{
		"tollgate " + modVersion + "\n",
		"module   github.com/tollgate/tollgate\n",
		"go       " + goVersion + " " + runtime.GOOS + "/" + runtime.GOARCH + "\n",
	} {
		if modVersion == "" || !strings.Contains(got, want) {
			t.Errorf("tollgate version printed\n%s\nwant a line %q (go version -m says\n%s)", got, want, meta)
		}
	}
}

// TestVersionInGitCheckout builds tollgate with `go build` in a git
// checkout of this tree and finds the checkout's commit in `tollgate
// version`, then the modified flag once the tree has an untracked file.
// The checkout is a fresh repository holding a copy of the working tree,
// so the test runs the same in a clone, a worktree or a source archive.
func TestVersionInGitCheckout(t *testing.T) {
	dir := t.TempDir()
	copyTree(t, filepath.Join("..", ".."), dir)
	runOut(t, dir, nil, "git", "init", "-q")
	runOut(t, dir, nil, "git", "add", "-A")
	runOut(t, dir, nil, "git", "-c", "user.name=tollgate", "-c", "user.email=tollgate@example.invalid", "commit", "-q", "-m", "tree")
	rev := strings.TrimSpace(runOut(t, dir, nil, "git", "rev-parse", "HEAD"))

	build := func() string {
		bin := filepath.Join(t.TempDir(), "tollgate")
		// The flags of make image, so the packages come from the build cache.
		runOut(t, dir, []string{"CGO_ENABLED=0"}, "go", "build", "-buildvcs=true", "-trimpath", "-o", bin, "./cmd/tollgate")
		return runOut(t, "", nil, bin, "version")
	}
	got := build()
	if !strings.Contains(got, "\ncommit   "+rev+" ") || strings.Contains(got, "(modified)") {
		t.Errorf("clean checkout at %s: tollgate version printed\n%s\nwant the commit, not modified", rev, got)
	}
	if !strings.HasPrefix(got, "tollgate v0.0.0-") || !strings.Contains(got, "-"+rev[:12]+"\n") {
		t.Errorf("clean checkout at %s: tollgate version printed\n%s\nwant a pseudo-version ending in the commit", rev, got)
	}

	if err := os.WriteFile(filepath.Join(dir, "stray.txt"), []byte("not committed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got = build()
	if !strings.Contains(got, "\ncommit   "+rev+" ") || !strings.Contains(got, " (modified)\n") || !strings.Contains(got, "+dirty\n") {
		t.Errorf("modified checkout at %s: tollgate version printed\n%s\nwant the commit, modified, and a +dirty version", rev, got)
	}
}

// copyTree copies the files git would commit in src (tracked, and
// untracked but not ignored) into dst.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	list := runOut(t, src, nil, "git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	for _, name := range strings.Split(strings.TrimRight(list, "\x00"), "\x00") {
		fi, err := os.Lstat(filepath.Join(src, name))
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the working tree, or not a file
		}
		data, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(dst, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, name), data, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
}

// runOut runs a command in dir (the package's directory when empty), with
// extra environment variables, and returns its standard output.
func runOut(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, errb.String())
	}
	return out.String()
}
