package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/lab"
	"github.com/tollgate/tollgate/internal/sim"
)

func init() {
	register(command{
		name:    "simulate",
		summary: "run traffic through the six algorithms: a table and a chart; suggest a limit for a recorded client",
		run:     runSimulate,
	})
}

func runSimulate(ctx context.Context, args []string, getenv env, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tollgate simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		pattern  = fs.String("pattern", "all", "traffic: "+strings.Join(sim.Patterns, ", ")+", or all")
		csvFile  = fs.String("csv", "", "traffic from a CSV file of request times (seconds or RFC 3339, first field) instead of -pattern; also suggests a limit")
		rate     = fs.Int("rate", 10, "the limit: requests per period (with -csv, default: the suggested rate)")
		period   = fs.Duration("period", time.Second, "the limit's period")
		burst    = fs.Int("burst", 0, "the bucket algorithms' burst (default: the rate)")
		maxDelay = fs.Duration("max-delay", -1, "the leaky bucket shapes, delaying requests up to this (default: the period); 0 makes it police")
		lburst   = fs.Int("leaky-burst", 0, "the leaky bucket's burst (default: 1 when it shapes, so what leaves is evenly spaced; the burst when it polices)")
		span     = fs.Duration("duration", 0, "how long a pattern lasts (default: 20 periods)")
		seed     = fs.Uint64("seed", 1, "seed of the bursty pattern's random arrivals")
		bin      = fs.Duration("bin", 0, "the chart's bin (default: a tenth of the period)")
		out      = fs.String("out", "", "write <traffic>.md (the table) and <traffic>.svg (the chart) into this directory")
		withRdb  = fs.Bool("redis", false, "replay every decision through Redis too (REDIS_URL, or a throwaway redis-server): check it decides as memory does and measure its state with MEMORY USAGE")
	)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: tollgate simulate [flags]")
		fmt.Fprintln(stderr, "\nRuns traffic through every algorithm on a virtual clock and prints a Markdown table per traffic:")
		fmt.Fprintln(stderr, "admitted, denied, the most admitted in any period, the decisions that differ from an exact")
		fmt.Fprintln(stderr, "sliding log, and the bytes of state a key holds. -out also writes an SVG chart per traffic.")
		fmt.Fprintln(stderr, "\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "tollgate simulate: unexpected arguments %q\n", fs.Args())
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	fail := func(err error) int {
		fmt.Fprintln(stderr, "tollgate simulate:", err)
		return 1
	}

	var traffic []sim.Traffic
	if *csvFile != "" {
		if set["pattern"] {
			fmt.Fprintln(stderr, "tollgate simulate: -csv and -pattern exclude each other")
			return 2
		}
		f, err := os.Open(*csvFile)
		if err != nil {
			return fail(err)
		}
		tr, err := sim.ReadCSV(f, strings.TrimSuffix(filepath.Base(*csvFile), filepath.Ext(*csvFile)))
		_ = f.Close()
		if err != nil {
			return fail(err)
		}
		rec, err := sim.Recommend(tr)
		if err != nil {
			return fail(err)
		}
		if err := rec.Write(stdout); err != nil {
			return fail(err)
		}
		fmt.Fprintln(stdout)
		if !set["rate"] {
			*rate, *period = rec.Limit.Rate, time.Second
			if !set["burst"] {
				*burst = rec.Limit.Burst
			}
		}
		traffic = append(traffic, tr)
	}

	if *burst == 0 {
		*burst = *rate
	}
	if *maxDelay < 0 {
		*maxDelay = *period
	}
	limit := tollgate.Limit{Rate: *rate, Period: *period, Burst: *burst}
	if err := limit.Validate(); err != nil {
		fmt.Fprintln(stderr, "tollgate simulate:", err)
		return 2
	}
	if *span == 0 {
		*span = 20 * *period
	}
	if *csvFile == "" {
		names := sim.Patterns
		if *pattern != "all" {
			names = []string{*pattern}
		}
		for _, name := range names {
			tr, err := sim.Pattern(name, limit, *span, *seed)
			if err != nil {
				fmt.Fprintln(stderr, "tollgate simulate:", err)
				return 2
			}
			traffic = append(traffic, tr)
		}
	}

	if *lburst == 0 && *maxDelay > 0 {
		*lburst = 1
	}
	cfg := sim.Config{Limit: limit, MaxDelay: *maxDelay, LeakyBurst: *lburst}
	if *withRdb {
		r, err := lab.Connect(ctx, getenv("REDIS_URL"), stderr)
		if err != nil {
			return fail(err)
		}
		defer r.Close()
		cfg.Redis = r.Client
	}
	if *out != "" {
		if err := os.MkdirAll(*out, 0o755); err != nil {
			return fail(err)
		}
	}
	for i, tr := range traffic {
		rep, err := sim.Run(ctx, tr, cfg)
		if err != nil {
			return fail(err)
		}
		var table bytes.Buffer
		if err := sim.WriteTable(&table, rep); err != nil {
			return fail(err)
		}
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		if _, err := stdout.Write(table.Bytes()); err != nil {
			return fail(err)
		}
		if *out == "" {
			continue
		}
		var chart bytes.Buffer
		if err := sim.WriteSVG(&chart, rep, *bin); err != nil {
			return fail(err)
		}
		for name, data := range map[string][]byte{tr.Name + ".md": table.Bytes(), tr.Name + ".svg": chart.Bytes()} {
			if err := os.WriteFile(filepath.Join(*out, name), data, 0o644); err != nil {
				return fail(err)
			}
		}
	}
	return 0
}
