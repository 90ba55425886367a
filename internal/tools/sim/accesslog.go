package sim

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// An access log holds many clients' requests, one a line, in time order
// (a line up to MaxLate earlier than one before it is read as if it came
// at that line's time: the clock of a replay never goes back). Three
// formats are read:
//
//   - nginx: the combined format (and the common one, which ends after
//     the bytes sent): $remote_addr - $remote_user [$time_local] "$request"
//     $status $body_bytes_sent ...; the client is remote_addr, or
//     remote_user.
//   - json: one JSON object a line; the client and the time are fields,
//     nested ones named with dots (Caddy's access log: request.client_ip
//     and ts).
//   - csv: a header line naming the columns, then one request a line; or,
//     with the columns given as numbers from 1, no header. Fields may be
//     quoted, but not span lines.
//
// A time is seconds since the Unix epoch (a number, or a string of one,
// with up to 6 decimals kept), or RFC 3339 text; nginx's is its
// $time_local (02/Jan/2006:15:04:05 -0700), to the second. A line that is
// not a request — not in the format, no client or time, a client longer
// than MaxClientBytes, a line longer than MaxLineBytes, a time more than
// MaxLate before an earlier line's — is a bad line: counted, the first few
// kept with their numbers and reasons, and skipped. Blank lines are
// skipped, and in csv so are lines starting with '#'.
const (
	// MaxLineBytes is the longest line read; a longer one is a bad line.
	MaxLineBytes = 64 << 10
	// MaxClientBytes is the longest client name: tollgate's longest key.
	MaxClientBytes = 512
	// MaxLate is how much earlier than an earlier line a line may be.
	MaxLate = time.Minute
	// badShown is how many bad lines a Tuning keeps.
	badShown = 5
)

// LogOptions say how to read an access log.
type LogOptions struct {
	// Format is "nginx", "json" or "csv"; "" picks it from the first line
	// that is not blank: '{' starts json, nginx's format is nginx, anything
	// else is csv.
	Format string
	// Client names the field that names a client: nginx's remote_addr
	// (the default) or remote_user; a JSON key, dotted for nested objects
	// (default "client"); a CSV column, by its name in the header or its
	// number from 1 (default "client").
	Client string
	// Time names the field of the request's time, as Client does (default
	// "time"); nginx's is always $time_local.
	Time string
	// MaxClients bounds how many clients are told apart (default
	// DefaultMaxClients, at most MaxClientsLimit): the requests of the
	// clients first seen after that many are counted but not analysed.
	MaxClients int
}

// BadLine is a line that is not a request: its number, from 1, and why.
type BadLine struct {
	Line   int64
	Reason string
}

// logFormat is how the lines of one log are read, as its first pass
// found out: every pass reads them alike.
type logFormat struct {
	name       string // nginx, json or csv
	user       bool   // nginx: the client is remote_user
	paths      [2][]string
	cols       [2]int // csv: the client's and the time's columns, from 0
	headerLine int64  // csv: the header's line number, 0 for none
}

// newLogFormat returns the format of o for a log whose first line that
// is not blank is first, at line number n.
func newLogFormat(o LogOptions, first []byte, n int64) (logFormat, error) {
	f := logFormat{name: o.Format}
	if f.name == "" {
		switch {
		case bytes.HasPrefix(bytes.TrimSpace(first), []byte("{")):
			f.name = "json"
		case parseNginx(first, false, nil) == nil:
			f.name = "nginx"
		default:
			f.name = "csv"
		}
	}
	client, when := cmp.Or(o.Client, "client"), cmp.Or(o.Time, "time")
	switch f.name {
	case "nginx":
		switch o.Client {
		case "", "remote_addr":
		case "remote_user":
			f.user = true
		default:
			return f, fmt.Errorf("the client of an nginx log is remote_addr or remote_user, not %q", o.Client)
		}
		if o.Time != "" && o.Time != "time_local" {
			return f, fmt.Errorf("the time of an nginx log is time_local, not %q", o.Time)
		}
	case "json":
		f.paths = [2][]string{strings.Split(client, "."), strings.Split(when, ".")}
	case "csv":
		return csvFormat(f, client, when, first, n)
	default:
		return f, fmt.Errorf("unknown log format %q (want nginx, json or csv)", o.Format)
	}
	return f, nil
}

// csvFormat finds the client's and the time's columns: by number, or by
// name in first, the header.
func csvFormat(f logFormat, client, when string, first []byte, n int64) (logFormat, error) {
	a, errA := strconv.Atoi(client)
	b, errB := strconv.Atoi(when)
	if errA == nil && errB == nil {
		if a < 1 || b < 1 {
			return f, fmt.Errorf("csv columns are numbered from 1, not %d and %d", a, b)
		}
		f.cols = [2]int{a - 1, b - 1}
		return f, nil
	}
	f.headerLine, f.cols = n, [2]int{-1, -1}
	for i := 0; ; i++ {
		name, rest, err := csvField(first)
		if err != nil {
			return f, fmt.Errorf("the csv header, line %d: %w", n, err)
		}
		switch strings.TrimSpace(string(name)) {
		case client:
			f.cols[0] = i
		case when:
			f.cols[1] = i
		}
		if rest == nil {
			break
		}
		first = rest
	}
	if f.cols[0] < 0 || f.cols[1] < 0 {
		return f, fmt.Errorf("the csv header, line %d, has no column %q and %q (name them with the client and time options, or number them from 1)", n, client, when)
	}
	return f, nil
}

// lineParser reads one line of a log of a format, keeping the last time
// it parsed: consecutive lines mostly share a second.
type lineParser struct {
	f      logFormat
	last   []byte // the last time's text
	lastUS int64
	lastOK bool
}

var (
	errNginx     = errors.New(`not nginx's combined format: ADDR - USER [TIME] "REQUEST" STATUS BYTES and more`)
	errNoUser    = errors.New("no remote_user (-)")
	errNoClient  = errors.New("no client")
	errLongName  = fmt.Errorf("a client longer than %d bytes", MaxClientBytes)
	errBadTime   = errors.New("bad time: want seconds since the Unix epoch or RFC 3339")
	errNginxTime = errors.New("bad time: want nginx's $time_local, 02/Jan/2006:15:04:05 -0700")
)

// parse returns the client and the time, in µs since the Unix epoch, of
// one line. The client is a slice of line, or of a copy for an escaped
// JSON string.
func (p *lineParser) parse(line []byte) ([]byte, int64, error) {
	var client, when []byte
	switch p.f.name {
	case "nginx":
		var f [2][]byte
		if err := parseNginx(line, p.f.user, &f); err != nil {
			return nil, 0, err
		}
		client, when = f[0], f[1]
	case "json":
		v, err := jsonFields(line, &p.f.paths)
		if err != nil {
			return nil, 0, err
		}
		if client, err = jsonText(v[0], p.f.paths[0]); err != nil {
			return nil, 0, err
		}
		if when, err = jsonText(v[1], p.f.paths[1]); err != nil {
			return nil, 0, err
		}
	case "csv":
		var err error
		if client, when, err = csvColumns(line, p.f.cols); err != nil {
			return nil, 0, err
		}
	}
	switch {
	case len(client) == 0:
		return nil, 0, errNoClient
	case len(client) > MaxClientBytes:
		return nil, 0, errLongName
	}
	us, err := p.time(when)
	return client, us, err
}

// time parses a time's text, or returns the last one's when it is the
// same text.
func (p *lineParser) time(b []byte) (int64, error) {
	if p.last != nil && bytes.Equal(b, p.last) {
		if !p.lastOK {
			return 0, p.timeError()
		}
		return p.lastUS, nil
	}
	p.last = append(p.last[:0], b...)
	p.lastOK = false
	switch {
	case p.f.name == "nginx":
		t, err := time.Parse("02/Jan/2006:15:04:05 -0700", string(b))
		if err != nil {
			return 0, errNginxTime
		}
		p.lastUS = t.UnixMicro()
	case len(b) > 0 && '0' <= b[0] && b[0] <= '9' && !bytes.ContainsAny(b, "-:T"):
		us, ok := secondsUS(b)
		if !ok {
			return 0, errBadTime
		}
		p.lastUS = us
	default:
		t, err := time.Parse(time.RFC3339Nano, string(b))
		if err != nil {
			return 0, errBadTime
		}
		p.lastUS = t.UnixMicro()
	}
	p.lastOK = true
	return p.lastUS, nil
}

func (p *lineParser) timeError() error {
	if p.f.name == "nginx" {
		return errNginxTime
	}
	return errBadTime
}

// secondsUS reads decimal seconds as µs, digit by digit so that a Unix
// time keeps its µs (a float64 would not); decimals past the sixth are
// dropped. It reports false for anything but digits with at most one '.'.
func secondsUS[T string | []byte](s T) (int64, bool) {
	var sec, frac int64
	i, fracDigits := 0, 0
	for ; i < len(s) && s[i] != '.'; i++ {
		if s[i] < '0' || s[i] > '9' || sec > (math.MaxInt64/1_000_000-9)/10 {
			return 0, false
		}
		sec = sec*10 + int64(s[i]-'0')
	}
	if i == 0 {
		return 0, false
	}
	if i < len(s) {
		i++ // '.'
		if i == len(s) {
			return 0, false
		}
		for ; i < len(s); i++ {
			if s[i] < '0' || s[i] > '9' {
				return 0, false
			}
			if fracDigits < 6 {
				frac = frac*10 + int64(s[i]-'0')
				fracDigits++
			}
		}
	}
	for ; fracDigits < 6; fracDigits++ {
		frac *= 10
	}
	return sec*1_000_000 + frac, true
}

// parseNginx checks that line is in nginx's combined (or common) format
// and, when f is not nil, sets f to its client (remote_addr, or
// remote_user when user) and its $time_local.
func parseNginx(line []byte, user bool, f *[2][]byte) error {
	sp := bytes.IndexByte(line, ' ')
	if sp <= 0 {
		return errNginx
	}
	addr, rest := line[:sp], line[sp+1:]
	if sp = bytes.IndexByte(rest, ' '); sp < 0 { // $remote_ident, "-"
		return errNginx
	}
	rest = rest[sp+1:]
	open := bytes.Index(rest, []byte(" ["))
	if open < 0 {
		return errNginx
	}
	who, rest := rest[:open], rest[open+2:]
	end := bytes.IndexByte(rest, ']')
	if end < 0 {
		return errNginx
	}
	when, rest := rest[:end], rest[end+1:]
	if !bytes.HasPrefix(rest, []byte(` "`)) {
		return errNginx
	}
	rest = rest[2:]
	// nginx writes a '"' of the request line as \x22: the next one ends it.
	if end = bytes.IndexByte(rest, '"'); end < 0 {
		return errNginx
	}
	rest = rest[end+1:]
	if len(rest) < 4 || rest[0] != ' ' || digitsFrom(rest, 1) != 4 || (len(rest) > 4 && rest[4] != ' ') {
		return errNginx // the status: three digits
	}
	if f == nil {
		return nil
	}
	f[0], f[1] = addr, when
	if user {
		if string(who) == "-" {
			return errNoUser
		}
		f[0] = who
	}
	return nil
}

// jsonText returns the text of a client's or a time's JSON value: a
// string's or a number's.
func jsonText(v jsonValue, path []string) ([]byte, error) {
	switch {
	case !v.found:
		return nil, fmt.Errorf("no field %s", strings.Join(path, "."))
	case v.kind != "":
		return nil, fmt.Errorf("field %s is %s, not a string or a number", strings.Join(path, "."), v.kind)
	}
	return v.text()
}

// csvColumns returns the fields of line in the columns cols.
func csvColumns(line []byte, cols [2]int) (a, b []byte, err error) {
	found := 0
	for i := 0; ; i++ {
		field, rest, err := csvField(line)
		if err != nil {
			return nil, nil, err
		}
		if i == cols[0] {
			a, found = bytes.TrimSpace(field), found+1
		}
		if i == cols[1] {
			b, found = bytes.TrimSpace(field), found+1
		}
		if rest == nil || found == 2 {
			break
		}
		line = rest
	}
	if found < 2 {
		return nil, nil, fmt.Errorf("fewer than %d fields", max(cols[0], cols[1])+1)
	}
	return a, b, nil
}

// csvField returns the first field of line, unquoted, and what follows its
// comma (nil when it is the last field). A quoted field's "" is a '"'; a
// field with one needs a copy.
func csvField(line []byte) (field, rest []byte, err error) {
	if q := bytes.TrimLeft(line, " \t"); len(q) > 0 && q[0] == '"' {
		var copied []byte
		start := 1
		for i := 1; ; {
			j := bytes.IndexByte(q[i:], '"')
			if j < 0 {
				return nil, nil, errors.New("a quoted field without its closing quote")
			}
			i += j
			if i+1 < len(q) && q[i+1] == '"' { // "" inside quotes
				copied = append(copied, q[start:i+1]...)
				i += 2
				start = i
				continue
			}
			field = q[start:i]
			if copied != nil {
				field = append(copied, field...)
			}
			after := bytes.TrimLeft(q[i+1:], " \t")
			switch {
			case len(after) == 0:
				return field, nil, nil
			case after[0] == ',':
				return field, after[1:], nil
			}
			return nil, nil, errors.New("text after a quoted field's closing quote")
		}
	}
	if i := bytes.IndexByte(line, ','); i >= 0 {
		return line[:i], line[i+1:], nil
	}
	return line, nil, nil
}

// lineReader reads lines of at most MaxLineBytes, numbering them from 1.
type lineReader struct {
	r *bufio.Reader
	n int64
}

func newLineReader(r io.Reader) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(r, MaxLineBytes)}
}

// next returns the next line without its end of line ("\n" or "\r\n"), and
// whether it was longer than MaxLineBytes, in which case the rest of it is
// skipped. At the end it returns io.EOF.
func (l *lineReader) next() (line []byte, long bool, err error) {
	line, err = l.r.ReadSlice('\n')
	for errors.Is(err, bufio.ErrBufferFull) {
		long, line = true, nil
		_, err = l.r.ReadSlice('\n')
	}
	switch {
	case errors.Is(err, io.EOF) && (len(line) > 0 || long):
		err = nil // a last line without its end of line
	case err != nil:
		return nil, false, err
	}
	l.n++
	line = bytes.TrimSuffix(line, []byte("\n"))
	return bytes.TrimSuffix(line, []byte("\r")), long, nil
}
