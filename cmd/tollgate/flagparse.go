package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/tollgate/tollgate/internal/store/redisurl"
)

// parseFlags parses args with fs, whose name is the command's ("tollgate
// serve"). -h prints fs.Usage and reports 0. A flag fs cannot take prints
// two lines, the error (for an unknown flag with the nearest one, when
// one is near) and where the flags are listed, and reports 2: the whole
// list after an error would push it out of sight.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) (code int, ok bool) {
	usage := fs.Usage
	if usage == nil {
		usage = func() {
			fmt.Fprintf(stderr, "Usage of %s:\n", fs.Name())
			fs.PrintDefaults()
		}
	}
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(stderr)
	fs.Usage = usage
	switch {
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		usage()
		return 0, false
	}
	fmt.Fprintf(stderr, "%s: %s\n", fs.Name(), flagError(fs, err))
	fmt.Fprintf(stderr, "Run '%s -h' for its flags.\n", fs.Name())
	return 2, false
}

// flagError rewrites an error of package flag as tollgate's docs write
// flags (--config, not -config), naming for an unknown flag the nearest
// known one.
func flagError(fs *flag.FlagSet, err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		msg = "unknown flag --" + name
		if near := nearestFlag(fs, name); near != "" {
			msg += " (did you mean --" + near + "?)"
		}
		return msg
	}
	for _, p := range []string{"flag needs an argument: -", " for flag -", " for -"} {
		msg = strings.Replace(msg, p, p+"-", 1)
	}
	return msg
}

// nearestFlag returns the flag of fs nearest to name, when it is near
// enough to be what was meant: at most one edit (a letter added, dropped,
// changed, or two swapped) for every three letters, and three in all.
func nearestFlag(fs *flag.FlagSet, name string) string {
	best, bestD := "", min(3, max(1, len(name)/3))+1
	fs.VisitAll(func(f *flag.Flag) {
		if d := editDistance(name, f.Name); d < bestD {
			best, bestD = f.Name, d
		}
	})
	return best
}

// editDistance is the optimal string alignment distance between a and b:
// the fewest insertions, deletions, substitutions and swaps of adjacent
// bytes that turn one into the other.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// checkEarly checks the flags of serve and proxy that need no file and no
// network, so that a value that cannot work stops the command (exit 2)
// before the rules load: how HTTP requests become descriptors, and the
// --redis URL's form (the client it makes connects only when used, and is
// closed at once). Its errors never show the URL's credentials.
func (f *serveFlags) checkEarly() error {
	if _, err := f.httpRules(); err != nil {
		return err
	}
	if f.redis == "" {
		return nil
	}
	c, err := redisurl.NewClient(f.redis)
	if err != nil {
		return fmt.Errorf("--redis: %s", strings.TrimPrefix(err.Error(), "redisstore: "))
	}
	return c.Close()
}
