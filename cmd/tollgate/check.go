package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/tollgate/tollgate/internal/service/config"
)

func init() {
	register(command{
		name:    "check",
		summary: "validate rules files as serve loads them, before a deploy: errors and warnings at file:line:col",
		run:     runCheck,
	})
}

// checkFlags are check's flags: serve's flags for reading rules files,
// so that check reads them exactly as serve would.
type checkFlags struct {
	files              rulesFileFlags
	config             string
	strict, json, dump bool
}

// problem is one error or warning, as --json prints it. The field names
// are documented in docs/service.md ("Checking rules before a deploy"):
// keep them.
type problem struct {
	File     string `json:"file"`
	Line     int    `json:"line"` // 0: the problem is the file's, not a line's
	Col      int    `json:"col"`  // 0: not known (YAML syntax errors give a line only)
	Severity string `json:"severity"`
	Message  string `json:"message"`
}

// checkReport is what --json prints.
type checkReport struct {
	Errors   int       `json:"errors"`
	Warnings int       `json:"warnings"`
	Problems []problem `json:"problems"`
}

// runCheck loads each path as serve --config would, with the same loader,
// options and bounds, and reports every error and warning. Exit 0: every
// path is valid (warnings allowed, unless --strict); 1: an error, or with
// --strict a warning; 2: bad usage.
func runCheck(_ context.Context, args []string, _ env, stdout, stderr io.Writer) int {
	f, paths, code, ok := parseCheck(args, stderr)
	if !ok {
		return code
	}
	rep := checkReport{Problems: []problem{}}
	var summaries []string
	var loaded []*config.Rules // by path, nil where invalid: what --dump prints
	for _, path := range paths {
		probs, rules := f.check(path)
		nerr, nwarn := count(probs)
		rep.Errors += nerr
		rep.Warnings += nwarn
		rep.Problems = append(rep.Problems, probs...)
		summaries = append(summaries, summary(path, rules, nerr, nwarn))
		if nerr > 0 {
			rules = nil
		}
		loaded = append(loaded, rules)
	}
	if f.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintln(stderr, "tollgate check:", err)
			return 1
		}
	} else {
		for _, p := range rep.Problems {
			fmt.Fprintln(stdout, p)
		}
		for i, s := range summaries {
			fmt.Fprintln(stdout, s)
			if f.dump && loaded[i] != nil {
				_ = loaded[i].Dump(stdout) // an error is stdout's
			}
		}
	}
	if rep.Errors > 0 || (f.strict && rep.Warnings > 0) {
		return 1
	}
	return 0
}

// parseCheck parses check's arguments: flags before, between or after
// the paths (everything after "--" is a path). When it reports false,
// check exits with code at once (0 for -h).
func parseCheck(args []string, stderr io.Writer) (f *checkFlags, paths []string, code int, ok bool) {
	fs := flag.NewFlagSet("tollgate check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f = new(checkFlags)
	f.files.register(fs)
	fs.StringVar(&f.config, "config", "", "a rules file or directory, as serve's --config (or give them as arguments)")
	fs.BoolVar(&f.strict, "strict", false, "exit 1 on warnings too, not only on errors")
	fs.BoolVar(&f.json, "json", false, "print one JSON object: {errors, warnings, problems: [{file, line, col, severity, message}]}")
	fs.BoolVar(&f.dump, "dump", false, "after each valid path's line, print its rules as serve's /rlconfig shows them: a line per limit")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: tollgate check [flags] PATH...")
		fmt.Fprintln(stderr, "\nLoads each PATH (a rules file, or a directory of them) as tollgate serve --config PATH would,")
		fmt.Fprintln(stderr, "with the same flags for reading it, and prints every error and warning as file:line:col.")
		fmt.Fprintln(stderr, "Exit 0: valid (warnings allowed unless --strict); 1: invalid; 2: bad usage.")
		fmt.Fprintln(stderr, "\nFlags:")
		fs.PrintDefaults()
	}
	for rest := args; ; {
		if code, ok := parseFlags(fs, rest, stderr); !ok {
			return nil, nil, code, false
		}
		if fs.NArg() == 0 {
			break
		}
		if used := len(rest) - fs.NArg(); used > 0 && rest[used-1] == "--" {
			paths = append(paths, fs.Args()...)
			break
		}
		paths = append(paths, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if f.config != "" {
		paths = append([]string{f.config}, paths...)
	}
	if len(paths) == 0 {
		fmt.Fprintln(stderr, "tollgate check: no rules to check: give a rules file or directory (see tollgate check -h)")
		return nil, nil, 2, false
	}
	if err := f.files.check(); err != nil {
		fmt.Fprintf(stderr, "tollgate check: %v\n", err)
		return nil, nil, 2, false
	}
	if f.dump && f.json {
		fmt.Fprintln(stderr, "tollgate check: --dump prints the rules as text: leave out --json")
		return nil, nil, 2, false
	}
	return f, paths, 0, true
}

// check loads path and returns its problems, sorted by file, line and
// column, and the rules when they loaded.
func (f *checkFlags) check(path string) ([]problem, *config.Rules) {
	var probs []problem
	warn := func(w config.Warning) {
		probs = append(probs, problem{File: w.File, Line: w.Line, Col: w.Column, Severity: "warning", Message: w.Msg})
	}
	rules, err := config.Load(path, append(f.files.options(), config.WithWarnings(warn))...)
	var le *config.LoadError
	switch {
	case errors.As(err, &le):
		for _, e := range le.Errors {
			probs = append(probs, errorProblem(path, e))
		}
	case err != nil:
		probs = append(probs, errorProblem(path, err))
	}
	slices.SortStableFunc(probs, func(a, b problem) int {
		return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line), cmp.Compare(a.Col, b.Col))
	})
	return probs, rules
}

// yamlLine matches the YAML parser's syntax errors, which give a line but
// no column.
var yamlLine = regexp.MustCompile(`^line (\d+): `)

// errorProblem is the problem of an error of Load: a *config.Error at its
// place, or one about path as a whole (no such file, too many files).
func errorProblem(path string, err error) problem {
	var e *config.Error
	if !errors.As(err, &e) {
		return problem{File: path, Severity: "error", Message: strings.TrimPrefix(err.Error(), "config: ")}
	}
	p := problem{File: e.File, Line: e.Line, Col: e.Column, Severity: "error", Message: e.Msg}
	if m := yamlLine.FindStringSubmatch(e.Msg); p.Line == 0 && m != nil {
		p.Line, _ = strconv.Atoi(m[1])
		p.Message = strings.TrimPrefix(e.Msg, m[0])
	}
	return p
}

// String formats p as compilers do: "file:line:col: severity: message",
// without the column or the line when they are not known.
func (p problem) String() string {
	at := p.File
	if p.Line > 0 {
		at += ":" + strconv.Itoa(p.Line)
		if p.Col > 0 {
			at += ":" + strconv.Itoa(p.Col)
		}
	}
	return at + ": " + p.Severity + ": " + p.Message
}

func count(probs []problem) (errs, warns int) {
	for _, p := range probs {
		if p.Severity == "error" {
			errs++
		} else {
			warns++
		}
	}
	return errs, warns
}

// summary is the last line about path: "rules: 2 files, 1 domain, 7 rules:
// valid, 1 warning", or "rules: invalid: 2 errors". When a rule has
// several limits (rate_limits), the rules are followed by how many limits
// they hold in all: "2 rules (4 limits)".
func summary(path string, rules *config.Rules, errs, warns int) string {
	counts := ""
	if warns > 0 {
		counts = ", " + plural(warns, "warning")
	}
	if errs > 0 {
		return fmt.Sprintf("%s: invalid: %s%s", path, plural(errs, "error"), counts)
	}
	limits := 0
	for _, r := range rules.All() {
		limits += max(len(r.Set), 1)
	}
	ruleCount := plural(len(rules.All()), "rule")
	if limits != len(rules.All()) {
		ruleCount += " (" + plural(limits, "limit") + ")"
	}
	return fmt.Sprintf("%s: %s, %s, %s: valid%s", path, plural(len(rules.Files()), "file"),
		plural(rules.Domains(), "domain"), ruleCount, counts)
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}
