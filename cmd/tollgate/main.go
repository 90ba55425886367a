// Command tollgate is tollgate's one binary: the decision service that
// gateways call (serve), a reverse proxy (proxy), the lab's demos (demo),
// the algorithm simulator (simulate), a rules checker (check) and a tuner
// from access logs (tune). Run "tollgate help" for the list.
// Run as "ratelimit" (envoyproxy/ratelimit's name), it is tollgate serve.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args, os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// env reads an environment variable (os.Getenv in main, a map in tests).
type env func(string) string

// command is one subcommand. Each lives in its own file and registers
// itself from init, so main stays a dispatcher.
type command struct {
	name    string
	summary string
	// run executes the command with its arguments (after the command's
	// name) and returns the process's exit code: 0 success, 1 failure,
	// 2 bad usage.
	run func(ctx context.Context, args []string, getenv env, stdout, stderr io.Writer) int
}

var commands []command

func register(c command) {
	commands = append(commands, c)
	slices.SortFunc(commands, func(a, b command) int { return strings.Compare(a.name, b.name) })
}

func run(ctx context.Context, args []string, getenv env, stdout, stderr io.Writer) int {
	// The image holds the binary as /bin/ratelimit too, envoyproxy/ratelimit's
	// path, which Envoy Gateway and Istio's sample run without arguments.
	if len(args) > 0 && filepath.Base(args[0]) == "ratelimit" {
		return runServe(ctx, args[1:], getenv, stdout, stderr)
	}
	if len(args) > 2 && args[1] == "help" {
		if slices.ContainsFunc(commands, func(c command) bool { return c.name == args[2] }) {
			// tollgate help serve: serve's -h, on stdout.
			return run(ctx, []string{args[0], args[2], "-h"}, getenv, stdout, stdout)
		}
		args = []string{args[0], args[2]} // an unknown command
	}
	if len(args) < 2 || args[1] == "help" || args[1] == "-h" || args[1] == "--help" {
		usage(stdout)
		if len(args) < 2 {
			return 2
		}
		return 0
	}
	for _, c := range commands {
		if c.name == args[1] {
			return c.run(ctx, args[2:], getenv, stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "tollgate: unknown command %q\n\n", args[1])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "tollgate: a distributed rate limiter (https://github.com/tollgate/tollgate)")
	fmt.Fprintln(w, "\nUsage: tollgate <command> [flags]   (tollgate <command> -h for its flags)")
	fmt.Fprintln(w, "\nCommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
}
