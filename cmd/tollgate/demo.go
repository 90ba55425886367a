package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"

	"github.com/tollgate/tollgate/internal/tools/lab"
)

func init() {
	register(command{
		name:    "demo",
		summary: "the lab's demos against REDIS_URL: bucket, drain, refill, race, boundary, skew",
		run:     runDemo,
	})
}

// demo is one of the lab's demos; flags adds its flags, if it has any.
type demo struct {
	name, summary string
	flags         func(*flag.FlagSet) func(ctx context.Context, r *lab.Redis, w io.Writer) error
}

var demos = []demo{
	{"bucket", "load the token-bucket script (SCRIPT LOAD) and print its SHA", func(*flag.FlagSet) func(context.Context, *lab.Redis, io.Writer) error {
		return func(ctx context.Context, r *lab.Redis, w io.Writer) error { return lab.Bucket(ctx, r.Client, w) }
	}},
	{"drain", "10 quick calls at 2/s, capacity 5: five allowed, then denied", func(*flag.FlagSet) func(context.Context, *lab.Redis, io.Writer) error {
		return func(ctx context.Context, r *lab.Redis, w io.Writer) error { return lab.Drain(ctx, r.Client, w) }
	}},
	{"refill", "drain, wait 3 s, see tokens=5; five calls pass, the sixth does not", func(fs *flag.FlagSet) func(context.Context, *lab.Redis, io.Writer) error {
		wait := fs.Duration("wait", lab.DefaultRefillWait, "how long to wait after the drain")
		return func(ctx context.Context, r *lab.Redis, w io.Writer) error { return lab.Refill(ctx, r.Client, w, *wait) }
	}},
	{"race", "two processes hammer one key: a naive GET-compare-SET limiter, then the Lua one", func(fs *flag.FlagSet) func(context.Context, *lab.Redis, io.Writer) error {
		g := fs.Int("goroutines", 32, "goroutines per process")
		n := fs.Int("requests", 1000, "requests per goroutine")
		return func(ctx context.Context, r *lab.Redis, w io.Writer) error {
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find this program to start its workers: %w", err)
			}
			spawn := func(ctx context.Context, args []string) *exec.Cmd {
				return exec.CommandContext(ctx, exe, append([]string{"demo", raceWorker}, args...)...)
			}
			_, err = lab.Race(ctx, r.Client, w, lab.RaceConfig{URL: r.URL, Spawn: spawn, Goroutines: *g, Requests: *n})
			return err
		}
	}},
	{"boundary", "a fixed window admits 2× its limit across a window edge; the bucket and sliding window do not", func(*flag.FlagSet) func(context.Context, *lab.Redis, io.Writer) error {
		return func(ctx context.Context, r *lab.Redis, w io.Writer) error {
			_, err := lab.Boundary(ctx, r.Client, w, lab.BoundaryConfig{})
			return err
		}
	}},
	{"skew", "call with now − 3600 s: the bucket is not rewarded", func(*flag.FlagSet) func(context.Context, *lab.Redis, io.Writer) error {
		return func(ctx context.Context, r *lab.Redis, w io.Writer) error { return lab.Skew(ctx, r.Client, w) }
	}},
}

// raceWorker is the hidden demo the race demo starts its processes with.
const raceWorker = "race-worker"

func runDemo(ctx context.Context, args []string, getenv env, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		w := stderr
		if len(args) > 0 {
			w = stdout
		}
		demoUsage(w)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == raceWorker {
		if err := lab.RaceWorker(ctx, args[1:], stdout); err != nil {
			fmt.Fprintln(stderr, "tollgate demo:", err)
			return 1
		}
		return 0
	}
	for _, d := range demos {
		if d.name != args[0] {
			continue
		}
		fs := flag.NewFlagSet("tollgate demo "+d.name, flag.ContinueOnError)
		fs.SetOutput(stderr)
		run := d.flags(fs)
		if code, ok := parseFlags(fs, args[1:], stderr); !ok {
			return code
		}
		if fs.NArg() > 0 {
			fmt.Fprintf(stderr, "tollgate demo %s: unexpected arguments %q\n", d.name, fs.Args())
			return 2
		}
		r, err := lab.Connect(ctx, getenv("REDIS_URL"), stderr)
		if err != nil {
			fmt.Fprintln(stderr, "tollgate demo:", err)
			return 1
		}
		defer r.Close()
		if err := run(ctx, r, stdout); err != nil {
			fmt.Fprintf(stderr, "tollgate demo %s: %v\n", d.name, err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(stderr, "tollgate demo: unknown demo %q\n\n", args[0])
	demoUsage(stderr)
	return 2
}

func demoUsage(w io.Writer) {
	fmt.Fprintln(w, "Usage: tollgate demo <name> [flags]")
	fmt.Fprintln(w, "\nThe lab's demos, against the Redis at REDIS_URL (default "+lab.DefaultURL+");")
	fmt.Fprintln(w, "when nothing answers there, a throwaway redis-server is started for the demo.")
	fmt.Fprintln(w, "\nDemos:")
	for _, d := range demos {
		fmt.Fprintf(w, "  %-9s %s\n", d.name, d.summary)
	}
}
