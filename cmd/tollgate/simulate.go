package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/tools/lab"
	"github.com/tollgate/tollgate/internal/tools/sim"
)

func init() {
	register(command{
		name:    "simulate",
		summary: "run traffic through the six algorithms: a table and a chart; suggest a limit for a recorded client",
		run:     runSimulate,
	})
}

// simFlags are simulate's flags.
type simFlags struct {
	pattern, csvFile, out string
	rate, burst, lburst   int
	period, maxDelay      time.Duration
	span, bin             time.Duration
	seed                  uint64
	withRdb               bool
	set                   map[string]bool // the flags given on the command line
}

func runSimulate(ctx context.Context, args []string, getenv env, stdout, stderr io.Writer) int {
	f, code, ok := parseSimulate(args, stderr)
	if !ok {
		return code
	}
	fail := func(err error) int {
		fmt.Fprintln(stderr, "tollgate simulate:", err)
		return 1
	}
	var traffic []sim.Traffic
	if f.csvFile != "" {
		if f.set["pattern"] {
			fmt.Fprintln(stderr, "tollgate simulate: -csv and -pattern exclude each other")
			return 2
		}
		tr, err := f.csvTraffic(stdout)
		if err != nil {
			return fail(err)
		}
		traffic = append(traffic, tr)
	}
	limit, err := f.limit()
	if err != nil {
		fmt.Fprintln(stderr, "tollgate simulate:", limitError(err))
		return 2
	}
	if f.lburst == 0 && f.maxDelay > 0 {
		f.lburst = 1
	}
	cfg := sim.Config{Limit: limit, MaxDelay: f.maxDelay, LeakyBurst: f.lburst}
	if err := cfg.Check(); err != nil {
		fmt.Fprintln(stderr, "tollgate simulate:", limitError(err))
		return 2
	}
	if f.csvFile == "" {
		if traffic, err = f.patterns(limit); err != nil {
			fmt.Fprintln(stderr, "tollgate simulate:", err)
			return 2
		}
	}
	if f.withRdb {
		r, err := lab.Connect(ctx, getenv("REDIS_URL"), stderr)
		if err != nil {
			return fail(err)
		}
		defer r.Close()
		cfg.Redis = r.Client
	}
	if f.out != "" {
		if err := os.MkdirAll(f.out, 0o755); err != nil {
			return fail(err)
		}
	}
	for i, tr := range traffic {
		if err := f.report(ctx, stdout, i > 0, tr, cfg); err != nil {
			return fail(err)
		}
	}
	return 0
}

// limitError is the text of an error about a limit: from "invalid limit"
// on, for an invalid one, without the names of the packages that passed
// it up (sim: tollgate: invalid limit: …), as the rules loader shows it.
func limitError(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "invalid limit: "); i >= 0 && errors.Is(err, tollgate.ErrInvalidLimit) {
		return msg[i:]
	}
	return msg
}

// parseSimulate parses simulate's arguments. When it reports false,
// simulate exits with code at once (0 for --help).
func parseSimulate(args []string, stderr io.Writer) (f *simFlags, code int, ok bool) {
	fs := flag.NewFlagSet("tollgate simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f = new(simFlags)
	fs.StringVar(&f.pattern, "pattern", "all", "traffic: "+strings.Join(sim.Patterns, ", ")+", or all")
	fs.StringVar(&f.csvFile, "csv", "", "traffic from a CSV file of request times (seconds or RFC 3339, first field; at most 100 years apart) instead of -pattern; also suggests a limit")
	fs.IntVar(&f.rate, "rate", 10, "the limit: requests per period (with -csv, default: the suggested rate)")
	fs.DurationVar(&f.period, "period", time.Second, "the limit's period")
	fs.IntVar(&f.burst, "burst", 0, "the bucket algorithms' burst (default: the rate)")
	fs.DurationVar(&f.maxDelay, "max-delay", -1, "the leaky bucket shapes, delaying requests up to this (default: the period); 0 makes it police")
	fs.IntVar(&f.lburst, "leaky-burst", 0, "the leaky bucket's burst (default: 1 when it shapes, so what leaves is evenly spaced; the burst when it polices)")
	fs.DurationVar(&f.span, "duration", 0, "how long a pattern lasts (default: 20 periods); a pattern holds at most 5,000,000 requests")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the bursty pattern's random arrivals")
	fs.DurationVar(&f.bin, "bin", 0, "the chart's bin (default: a tenth of the period, or a longer round one for traffic too long to chart so)")
	fs.StringVar(&f.out, "out", "", "write <traffic>.md (the table) and <traffic>.svg (the chart) into this directory")
	fs.BoolVar(&f.withRdb, "redis", false, "replay every decision through Redis too (REDIS_URL, or a throwaway redis-server): check it decides as memory does and measure its state with MEMORY USAGE")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: tollgate simulate [flags]")
		fmt.Fprintln(stderr, "\nRuns traffic through every algorithm on a virtual clock and prints a Markdown table per traffic:")
		fmt.Fprintln(stderr, "admitted, denied, the most admitted in any period, the decisions that differ from an exact")
		fmt.Fprintln(stderr, "sliding log, and the bytes of state a key holds. -out also writes an SVG chart per traffic.")
		fmt.Fprintln(stderr, "\nFlags:")
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return nil, code, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "tollgate simulate: unexpected arguments %q\n", fs.Args())
		return nil, 2, false
	}
	f.set = map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	return f, 0, true
}

// csvTraffic reads the traffic of -csv, writes the limit suggested for it
// to stdout, and takes that limit unless -rate (or -burst) was given.
func (f *simFlags) csvTraffic(stdout io.Writer) (sim.Traffic, error) {
	file, err := os.Open(f.csvFile)
	if err != nil {
		return sim.Traffic{}, err
	}
	tr, err := sim.ReadCSV(file, strings.TrimSuffix(filepath.Base(f.csvFile), filepath.Ext(f.csvFile)))
	_ = file.Close()
	if err != nil {
		return sim.Traffic{}, err
	}
	rec, err := sim.Recommend(tr)
	if err != nil {
		return sim.Traffic{}, err
	}
	if err := rec.Write(stdout); err != nil {
		return sim.Traffic{}, err
	}
	fmt.Fprintln(stdout)
	if !f.set["rate"] {
		f.rate, f.period = rec.Limit.Rate, time.Second
		if !f.set["burst"] {
			f.burst = rec.Limit.Burst
		}
	}
	return tr, nil
}

// limit fills in the defaults that follow from the rate and period, and
// returns the limit to simulate.
func (f *simFlags) limit() (tollgate.Limit, error) {
	if f.burst == 0 {
		f.burst = f.rate
	}
	if f.maxDelay < 0 {
		f.maxDelay = f.period
	}
	limit := tollgate.Limit{Rate: f.rate, Period: f.period, Burst: f.burst}
	if err := limit.Validate(); err != nil {
		return limit, err
	}
	if f.span == 0 {
		f.span = 20 * f.period
	}
	return limit, nil
}

// patterns is the traffic of -pattern: one pattern, or all of them.
func (f *simFlags) patterns(limit tollgate.Limit) ([]sim.Traffic, error) {
	names := sim.Patterns
	if f.pattern != "all" {
		names = []string{f.pattern}
	}
	var traffic []sim.Traffic
	for _, name := range names {
		tr, err := sim.Pattern(name, limit, f.span, f.seed)
		if err != nil {
			return nil, err
		}
		traffic = append(traffic, tr)
	}
	return traffic, nil
}

// report runs tr through the algorithms and writes its table to stdout
// (after a blank line when it is not the first), and with -out the table
// and the chart into files.
func (f *simFlags) report(ctx context.Context, stdout io.Writer, blank bool, tr sim.Traffic, cfg sim.Config) error {
	rep, err := sim.Run(ctx, tr, cfg)
	if err != nil {
		return err
	}
	var table bytes.Buffer
	if err := sim.WriteTable(&table, rep); err != nil {
		return err
	}
	if blank {
		fmt.Fprintln(stdout)
	}
	if _, err := stdout.Write(table.Bytes()); err != nil {
		return err
	}
	if f.out == "" {
		return nil
	}
	// The table first: a chart that cannot be drawn (-bin too fine) does
	// not cost it.
	if err := os.WriteFile(filepath.Join(f.out, tr.Name+".md"), table.Bytes(), 0o644); err != nil {
		return err
	}
	var chart bytes.Buffer
	if err := sim.WriteSVG(&chart, rep, f.bin); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(f.out, tr.Name+".svg"), chart.Bytes(), 0o644)
}
