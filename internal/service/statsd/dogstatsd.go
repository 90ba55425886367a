package statsd

import (
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// DogStatsD is envoy's USE_DOG_STATSD: the same statistics, kept and
// flushed the same way, sent over UDP in DogStatsD's format, as envoy's
// service sends them through Datadog's Go client (datadog-go v5):
//
//	name:value|c          a counter, what it grew by since the last flush
//	name:value|g          a gauge
//	name:value.000000|ms  a timer, in whole milliseconds
//
// each line ended by a newline, the lines of one datagram together up to
// 1,432 bytes (the client's size for UDP), sent when a flush ends and at
// least every 100 ms for the timers. A line is followed by |#tag,tag when
// it has tags: first those of Datadog's own variables (DD_ENTITY_ID as
// dd.internal.entity_id, DD_ENV as env, DD_SERVICE as service, DD_VERSION
// as version: see DatadogEnvTags), then the statistic's gostats tags (the
// EXTRA_TAGS, which gostats writes into the name as .__key=value), then
// those of the first mogrifier whose pattern matches the name, which also
// renames it. Unlike Datadog's client, tollgate sends no statistics of its
// own sending (datadog.dogstatsd.client.*) and no container field (|c:).

// A Mogrifier renames the statistics whose names match its pattern and
// tags them, as envoy's DOG_STATSD_MOGRIFIER_<NAME>_PATTERN, _NAME and
// _TAGS say. $0 in the new name and in the tags' values is the whole
// match, $1, $2, … its groups; a $n past the groups stays as it is, as in
// envoy. The name a statistic is matched by is its gostats name without
// its gostats tags (ratelimit.service.rate_limit.domain.key_value.total_hits).
type Mogrifier struct {
	Label   string         // the NAME of USE_DOG_STATSD_MOGRIFIERS
	Pattern *regexp.Regexp // a Go regular expression, as envoy's is
	Name    string         // the new name
	Tags    []Tag          // in the order _TAGS gives them
}

// A Tag is one tag of a mogrifier: key:value, its value a template.
type Tag struct{ Key, Value string }

const (
	// MaxMogrifiers bounds how many mogrifiers one sink tries on each name.
	MaxMogrifiers = 64
	// MaxMogrifierBytes bounds each of a mogrifier's variables.
	MaxMogrifierBytes = 4096
	// dogDatagram is the most bytes sent in one datagram, Datadog's
	// client's OptimalUDPPayloadSize; a line longer than that is dropped,
	// as that client drops it.
	dogDatagram = 1432
	// dogFlushEvery is how often what is buffered is sent (the timers
	// between flushes), as that client's BufferFlushInterval.
	dogFlushEvery = 100 * time.Millisecond
)

// MogrifierNames reads USE_DOG_STATSD_MOGRIFIERS as envoy reads it (a
// list of its settings library, envconfig): blank is none, anything else
// is split at each comma, as it is. MogrifiersFromEnv checks the names.
func MogrifierNames(list string) []string {
	if strings.TrimSpace(list) == "" {
		return nil
	}
	return strings.Split(list, ",")
}

var (
	mogrifierLabel = regexp.MustCompile(`^[A-Za-z0-9_]+$`)
	dollar         = regexp.MustCompile(`\$\d+`)
)

// MogrifiersFromEnv reads the mogrifiers names lists, in order, from the
// variables DOG_STATSD_MOGRIFIER_<NAME>_PATTERN, _NAME and _TAGS of
// getenv, NAME upper-cased as envoy's settings library upper-cases it. As
// envoy, it wants a pattern that compiles and a name, and tags written
// key:value,key:value with a key and a value each (a colon in either is
// refused: envoy's library splits at each one). It also refuses what
// would break a DogStatsD line: a colon or '|' in the name, '|' in a tag,
// and control characters; and a mogrifier name that no variable can
// carry (letters, digits and _ only). Unlike envoy's library, it never
// reads PATTERN, NAME or TAGS without the prefix.
func MogrifiersFromEnv(names []string, getenv func(string) string) ([]Mogrifier, error) {
	if len(names) > MaxMogrifiers {
		return nil, fmt.Errorf("statsd: %d mogrifiers, more than the limit of %d", len(names), MaxMogrifiers)
	}
	out := make([]Mogrifier, 0, len(names))
	for _, label := range names {
		m, err := mogrifierFromEnv(label, getenv)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

func mogrifierFromEnv(label string, getenv func(string) string) (Mogrifier, error) {
	if !mogrifierLabel.MatchString(label) {
		return Mogrifier{}, fmt.Errorf("statsd: mogrifier %q: want a name of letters, digits and _ (its variables are DOG_STATSD_MOGRIFIER_<NAME>_PATTERN, _NAME and _TAGS)", label)
	}
	prefix := "DOG_STATSD_MOGRIFIER_" + strings.ToUpper(label) + "_"
	fail := func(format string, args ...any) (Mogrifier, error) {
		return Mogrifier{}, fmt.Errorf("statsd: mogrifier %s: "+format, append([]any{label}, args...)...)
	}
	vars := map[string]string{}
	for _, v := range []string{"PATTERN", "NAME", "TAGS"} {
		val := getenv(prefix + v)
		if len(val) > MaxMogrifierBytes {
			return fail("%s%s: %d bytes, more than the limit of %d", prefix, v, len(val), MaxMogrifierBytes)
		}
		vars[v] = val
	}
	if vars["PATTERN"] == "" {
		return fail("no %sPATTERN", prefix)
	}
	re, err := regexp.Compile(vars["PATTERN"])
	if err != nil {
		return fail("%sPATTERN: %w", prefix, err)
	}
	name := vars["NAME"]
	if name == "" {
		return fail("no %sNAME", prefix)
	}
	if bad := lineBreaker(name, ":|"); bad != "" {
		return fail("%sNAME %q: %s would break a DogStatsD line", prefix, name, bad)
	}
	m := Mogrifier{Label: label, Pattern: re, Name: name}
	if tags := vars["TAGS"]; strings.TrimSpace(tags) != "" {
		for _, pair := range strings.Split(tags, ",") {
			kv := strings.Split(pair, ":")
			if len(kv) != 2 {
				return fail("%sTAGS: %q: want key:value,key:value", prefix, pair)
			}
			if kv[0] == "" || kv[1] == "" {
				return fail("%sTAGS: %q: want a key and a value", prefix, pair)
			}
			if bad := lineBreaker(pair, "|"); bad != "" {
				return fail("%sTAGS: %q: %s would break a DogStatsD line", prefix, pair, bad)
			}
			m.Tags = setTag(m.Tags, kv[0], kv[1])
		}
	}
	return m, nil
}

// setTag sets key in tags: a key given twice keeps its last value, as in
// envoy's map of them.
func setTag(tags []Tag, key, value string) []Tag {
	for i := range tags {
		if tags[i].Key == key {
			tags[i].Value = value
			return tags
		}
	}
	return append(tags, Tag{key, value})
}

// lineBreaker names the first of s's characters among chars, or control
// character, or returns "".
func lineBreaker(s, chars string) string {
	for _, r := range s {
		switch {
		case strings.ContainsRune(chars, r):
			return fmt.Sprintf("%q", r)
		case r < 0x20 || r == 0x7f:
			return fmt.Sprintf("the control character %U", r)
		}
	}
	return ""
}

// mogrify applies m to a name its pattern matched, match its groups.
func (m *Mogrifier) mogrify(match []string) (string, []string) {
	tags := make([]string, len(m.Tags))
	for i, t := range m.Tags {
		tags[i] = t.Key + ":" + expand(t.Value, match)
	}
	return expand(m.Name, match), tags
}

// expand replaces $n in template by match[n], leaving those past match.
func expand(template string, match []string) string {
	if !strings.Contains(template, "$") {
		return template
	}
	return dollar.ReplaceAllStringFunc(template, func(d string) string {
		if i, err := strconv.Atoi(d[1:]); err == nil && i < len(match) {
			return match[i]
		}
		return d
	})
}

// DatadogEnvTags are the tags Datadog's client gives every line, read
// from getenv as it reads them: DD_ENTITY_ID as dd.internal.entity_id,
// DD_ENV as env, DD_SERVICE as service, DD_VERSION as version, those set.
func DatadogEnvTags(getenv func(string) string) []string {
	var tags []string
	for _, m := range [...]struct{ env, tag string }{
		{"DD_ENTITY_ID", "dd.internal.entity_id"}, {"DD_ENV", "env"}, {"DD_SERVICE", "service"}, {"DD_VERSION", "version"},
	} {
		if v := getenv(m.env); v != "" {
			tags = append(tags, m.tag+":"+v)
		}
	}
	return tags
}

// DogOptions are what DogStatsD adds to Options.
type DogOptions struct {
	Mogrifiers []Mogrifier // tried in order; at most MaxMogrifiers
	Tags       []string    // key:value, first on every line (DatadogEnvTags)
}

// NewDogStatsd returns Stats sent to the DogStatsD agent at addr
// (host:port) over UDP. The host is resolved now, as Datadog's client
// resolves it when envoy starts; nothing waits for the agent: while it is
// away, what is sent is lost.
func NewDogStatsd(addr string, d DogOptions, o Options) (*Stats, error) {
	if err := checkAddr(addr); err != nil {
		return nil, err
	}
	if len(d.Mogrifiers) > MaxMogrifiers {
		return nil, fmt.Errorf("statsd: %d mogrifiers, more than the limit of %d", len(d.Mogrifiers), MaxMogrifiers)
	}
	conn, err := net.Dial("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("statsd: dogstatsd: %w", err)
	}
	sink := &dogSink{conn: conn, mogrifiers: d.Mogrifiers, tags: d.Tags, log: o.log(), buf: make([]byte, 0, dogDatagram)}
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(dogFlushEvery)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				sink.Flush()
			case <-done:
				return
			}
		}
	}()
	stop := func() {
		close(done)
		<-stopped
		sink.close()
	}
	return newStats(sink, o.Flush, o.Tags, o.Bound, stop), nil
}

// checkAddr refuses an address that is no host:port.
func checkAddr(addr string) error {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("statsd: address %q: want host:port", addr)
	}
	if port, err := strconv.Atoi(p); err != nil || port <= 0 || port > 65535 {
		return fmt.Errorf("statsd: address %q: want a port number", addr)
	}
	return nil
}

// dogSink writes DogStatsD lines, gathered into datagrams.
type dogSink struct {
	conn       net.Conn
	mogrifiers []Mogrifier
	tags       []string
	log        *slog.Logger

	mu      sync.Mutex
	buf     []byte // whole lines, at most dogDatagram bytes
	closed  bool
	dropped bool // a line too long was dropped (and logged) once
}

func (s *dogSink) FlushCounter(name string, value uint64) {
	s.line(name, strconv.FormatUint(value, 10), "c")
}

// FlushGauge sends a gauge as Datadog's client sends a float64.
func (s *dogSink) FlushGauge(name string, value uint64) {
	s.line(name, strconv.FormatFloat(float64(value), 'f', -1, 64), "g")
}

// FlushTimer sends a timer as envoy's sink does: the milliseconds made a
// time.Duration (whole milliseconds), which Datadog's client writes back
// as milliseconds with six decimals.
func (s *dogSink) FlushTimer(name string, ms float64) {
	d := time.Duration(ms) * time.Millisecond
	s.line(name, strconv.FormatFloat(d.Seconds()*1000, 'f', 6, 64), "ms")
}

// Flush sends what is gathered: gostats calls it when a flush ends.
func (s *dogSink) Flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.send()
}

func (s *dogSink) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.send()
	s.closed = true
	s.conn.Close()
}

// send writes the datagram gathered; s.mu is held.
func (s *dogSink) send() {
	if len(s.buf) > 0 && !s.closed {
		// An error (the agent away: ICMP's port unreachable) loses the
		// datagram, as with Datadog's client.
		_, _ = s.conn.Write(s.buf)
	}
	s.buf = s.buf[:0]
}

// line gathers one statistic, sending the datagram first when the line
// would not fit in it.
func (s *dogSink) line(name, value, typ string) {
	name, tags := s.mogrify(name)
	l := make([]byte, 0, len(name)+len(value)+len(typ)+64)
	l = append(append(append(append(append(l, name...), ':'), value...), '|'), typ...)
	for i, t := range tags {
		if i == 0 {
			l = append(l, "|#"...)
		} else {
			l = append(l, ',')
		}
		l = append(l, strings.ReplaceAll(t, "\n", "")...) // as Datadog's client does
	}
	l = append(l, '\n')
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if len(l) > dogDatagram {
		if !s.dropped {
			s.dropped = true
			s.log.Warn("statsd: a DogStatsD line longer than a datagram is dropped (this is said once)",
				"component", "statsd", "bytes", len(l), "max", dogDatagram, "name", truncate(name, 120))
		}
		return
	}
	if len(s.buf)+len(l) > dogDatagram {
		s.send()
	}
	s.buf = append(s.buf, l...)
}

// mogrify returns a gostats name as DogStatsD's name and tags: the
// global tags, the gostats tags taken out of the name, then renamed and
// tagged by the first mogrifier whose pattern matches what is left.
func (s *dogSink) mogrify(name string) (string, []string) {
	tags := append([]string(nil), s.tags...)
	short, tagText, hasTags := strings.Cut(name, ".__")
	if hasTags {
		for _, pair := range strings.Split(tagText, ".__") {
			if k, v, ok := strings.Cut(pair, "="); ok {
				tags = append(tags, k+":"+v)
			}
		}
	}
	for i := range s.mogrifiers {
		m := &s.mogrifiers[i]
		if match := m.Pattern.FindStringSubmatch(short); match != nil {
			renamed, more := m.mogrify(match)
			return renamed, append(tags, more...)
		}
	}
	return short, tags
}

// truncate shortens s to at most n bytes, for a log line.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
