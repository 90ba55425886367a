package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/tollgate/tollgate/internal/tools/sim"
)

func init() {
	register(command{
		name:    "tune",
		summary: "recommend a per-client limit from an access log (nginx, JSON lines, CSV) and show what it would have limited",
		run:     runTune,
	})
}

// tune is a command of its own, not a flag of simulate: it reads many
// clients from a log, three times over, where simulate runs one client's
// traffic (a pattern or a CSV of times) through the algorithms under a
// limit it is given, and none of simulate's flags (-pattern, -rate,
// -max-delay, ...) would mean anything here.

func runTune(ctx context.Context, args []string, _ env, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tollgate tune", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o sim.LogOptions
	var svg string
	fs.StringVar(&o.Format, "format", "", "the log's format: nginx (combined), json (JSON lines) or csv; default: from its first line")
	fs.StringVar(&o.Client, "client", "", "the field naming a client: nginx remote_addr (default) or remote_user; a JSON key, dotted for nested objects (default client); a CSV column's name in the header, or its number from 1 (default client)")
	fs.StringVar(&o.Time, "time", "", "the field of a request's time, as --client (default time; nginx: $time_local): seconds since the Unix epoch or RFC 3339")
	fs.IntVar(&o.MaxClients, "max-clients", sim.DefaultMaxClients, fmt.Sprintf("the most clients told apart (at most %d); the requests of later ones are counted, not analysed", sim.MaxClientsLimit))
	fs.StringVar(&svg, "svg", "", "write an SVG chart of the clients' rates and the recommendation to this file")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: tollgate tune [flags] LOG")
		fmt.Fprintln(stderr, "\nReads an access log of many clients (a file; *.gz is decompressed), counts each client's requests")
		fmt.Fprintln(stderr, "per second, and recommends one token bucket for every client: a rate just above the clients'")
		fmt.Fprintln(stderr, "sustained p99 (+ 10%) and a burst of 5 to 10 s of it, the smallest that leaves 99% of the")
		fmt.Fprintln(stderr, "clients never limited when the log is replayed through it. Then it replays the log through")
		fmt.Fprintln(stderr, "the six algorithms at that rate and prints the clients and requests each would have limited.")
		fmt.Fprintln(stderr, "\nFlags:")
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	switch {
	case fs.NArg() != 1:
		fmt.Fprintln(stderr, "tollgate tune: give one access log (see tollgate tune -h)")
		return 2
	case fs.Arg(0) == "-":
		fmt.Fprintln(stderr, "tollgate tune: the log is read three times, so it must be a file, not standard input")
		return 2
	case o.MaxClients < 1 || o.MaxClients > sim.MaxClientsLimit:
		fmt.Fprintf(stderr, "tollgate tune: --max-clients %d: want 1 to %d\n", o.MaxClients, sim.MaxClientsLimit)
		return 2
	}
	switch o.Format {
	case "", "nginx", "json", "csv":
	default:
		fmt.Fprintf(stderr, "tollgate tune: --format %q: want nginx, json or csv\n", o.Format)
		return 2
	}
	path := fs.Arg(0)
	tu, err := sim.Tune(ctx, func() (io.ReadCloser, error) { return openLog(path) }, o)
	if err != nil {
		fmt.Fprintf(stderr, "tollgate tune: %s\n", strings.TrimPrefix(err.Error(), "sim: tune: "))
		return 1
	}
	if err := tu.Write(stdout); err != nil {
		fmt.Fprintln(stderr, "tollgate tune:", err)
		return 1
	}
	if svg != "" {
		var chart bytes.Buffer
		if err := sim.WriteTuneSVG(&chart, tu, filepath.Base(path)+": requests per second of each client, ranked by their p99"); err != nil {
			fmt.Fprintln(stderr, "tollgate tune:", err)
			return 1
		}
		if err := os.WriteFile(svg, chart.Bytes(), 0o644); err != nil {
			fmt.Fprintln(stderr, "tollgate tune:", err)
			return 1
		}
	}
	return 0
}

// openLog opens an access log, decompressing a *.gz file.
func openLog(path string) (io.ReadCloser, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if !strings.HasSuffix(path, ".gz") {
		return f, nil
	}
	z, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return gzipFile{z, f}, nil
}

// gzipFile closes the decompressor and the file under it.
type gzipFile struct {
	*gzip.Reader
	f *os.File
}

func (g gzipFile) Close() error {
	err := g.Reader.Close()
	if ferr := g.f.Close(); err == nil {
		err = ferr
	}
	return err
}
