package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

func init() {
	register(command{
		name:    "version",
		summary: "the module version, the commit and the Go version this binary was built from",
		run:     runVersion,
	})
}

func runVersion(_ context.Context, args []string, _ env, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintf(stderr, "tollgate version: takes no arguments, got %q\n", args)
		return 2
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	fmt.Fprint(stdout, versionText(bi))
	return 0
}

// versionText is what `tollgate version` prints, read from the build
// information the Go toolchain embeds in every binary.
//
// The module version is what the toolchain stamped: the version asked for
// by `go install …@version`, a pseudo-version (with "+dirty" for a
// modified tree) when `go build` ran in a git checkout, and "(devel)"
// when it ran elsewhere or with -buildvcs=false. The commit and its
// "modified" flag come only from a build in a git checkout.
func versionText(bi *debug.BuildInfo) string {
	if bi == nil {
		return "tollgate unknown (built without module information)\n"
	}
	version := bi.Main.Version
	if version == "" {
		version = "(devel)"
	}
	var rev, when, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			when = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	commit := "unknown (built outside a git checkout, or with -buildvcs=false)"
	if rev != "" {
		commit = rev
		if when != "" {
			commit += " " + when
		}
		if modified == "true" {
			commit += " (modified)"
		}
	}
	return fmt.Sprintf("tollgate %s\nmodule   %s\ncommit   %s\ngo       %s %s\n",
		version, bi.Main.Path, commit, bi.GoVersion, runtime.GOOS+"/"+runtime.GOARCH)
}
