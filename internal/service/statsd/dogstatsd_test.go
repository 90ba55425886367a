package statsd

import (
	"bytes"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// agent is a DogStatsD agent of the test's own: a UDP socket on a free
// loopback port that keeps every datagram it is sent, whole.
type agent struct {
	addr string
	got  chan []byte
}

func listenAgent(t *testing.T) *agent {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	a := &agent{addr: pc.LocalAddr().String(), got: make(chan []byte, 4096)}
	go func() {
		buf := make([]byte, 65536)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			a.got <- bytes.Clone(buf[:n])
		}
	}()
	return a
}

// datagram returns the next datagram, or fails after 10 s.
func (a *agent) datagram(t *testing.T) []byte {
	t.Helper()
	select {
	case d := <-a.got:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no datagram in 10s")
		return nil
	}
}

// linesUntil reads datagrams until every line of want has come (in any
// order), or fails after 10 s. It checks that each datagram is whole
// lines, each ended by a newline, within a datagram's size, and returns
// every line that came but the Go runtime's.
func (a *agent) linesUntil(t *testing.T, want ...string) []string {
	t.Helper()
	var seen []string
	deadline := time.After(10 * time.Second)
	for {
		missing := slices.DeleteFunc(slices.Clone(want), func(w string) bool { return slices.Contains(seen, w) })
		if len(missing) == 0 {
			return seen
		}
		select {
		case d := <-a.got:
			if len(d) > dogDatagram || !bytes.HasSuffix(d, []byte("\n")) {
				t.Errorf("datagram of %d bytes, want at most %d, ending with a newline: %q", len(d), dogDatagram, d)
			}
			for _, l := range strings.Split(strings.TrimSuffix(string(d), "\n"), "\n") {
				if !strings.HasPrefix(l, "ratelimit.go.") {
					seen = append(seen, l)
				}
			}
		case <-deadline:
			t.Fatalf("lines %q did not come; came: %q", missing, seen)
		}
	}
}

// mogrifiers reads the mogrifiers names lists from env, or fails.
func mogrifiers(t *testing.T, env map[string]string, names ...string) []Mogrifier {
	t.Helper()
	ms, err := MogrifiersFromEnv(names, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// hitsEnv is the README's HITS mogrifier, and a DOMAIN one.
var hitsEnv = map[string]string{
	"DOG_STATSD_MOGRIFIER_HITS_PATTERN":   `^ratelimit\.service\.rate_limit\.([^.]+)\.(.*)\.([^.]+)$`,
	"DOG_STATSD_MOGRIFIER_HITS_NAME":      "ratelimit.service.rate_limit.$3",
	"DOG_STATSD_MOGRIFIER_HITS_TAGS":      "domain:$1,descriptor:$2",
	"DOG_STATSD_MOGRIFIER_CONFIG_PATTERN": `^ratelimit\.service\.(config_load_[a-z]+)$`,
	"DOG_STATSD_MOGRIFIER_CONFIG_NAME":    "tollgate.$1",
	"DOG_STATSD_MOGRIFIER_CONFIG_TAGS":    "kind:$1,whole:$0,past:$7",
}

// plainLines are the lines of TestDogStatsdLines's statistics, untagged.
var plainLines = []string{
	"ratelimit.service.rate_limit.d.key_value.total_hits:3|c",
	"ratelimit.service.rate_limit.d.key_value.over_limit:1|c",
	"ratelimit.service.rate_limit.d.key_value.within_limit:2|c",
	"ratelimit.service.config_load_success:1|c",
	"ratelimit.service.call.should_rate_limit.service_error:1|c",
	"ratelimit_server.ShouldRateLimit.total_requests:1|c",
	"ratelimit.redis_pool.cx_active:2|g",
	"ratelimit.redis_pool.cx_total:5|c",
	"ratelimit.redis_pool.cx_local_close:3|c",
}

// withTags is lines, each followed by tags.
func withTags(lines []string, tags string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = l + tags
	}
	return out
}

// TestDogStatsdLines: the statistics of a service, through NewDogStatsd
// to an agent: envoy's names, DogStatsD's types, Datadog's variables'
// tags, EXTRA_TAGS and the mogrifiers' tags, in that order.
func TestDogStatsdLines(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		dog   DogOptions
		extra map[string]string
		want  []string
		timer string // the response time's line, its value \d+
	}{
		{
			name:  "plain",
			want:  plainLines,
			timer: `ratelimit_server\.ShouldRateLimit\.response_time:\d+\.000000\|ms`,
		},
		{
			name:  "tagged",
			dog:   DogOptions{Tags: DatadogEnvTags(func(k string) string { return map[string]string{"DD_ENV": "prod", "DD_SERVICE": "ratelimit"}[k] })},
			extra: map[string]string{"cluster": "eg", "zone": "a"},
			want:  withTags(plainLines, "|#env:prod,service:ratelimit,cluster:eg,zone:a"),
			timer: `ratelimit_server\.ShouldRateLimit\.response_time:\d+\.000000\|ms\|#env:prod,service:ratelimit,cluster:eg,zone:a`,
		},
		{
			name:  "mogrified",
			dog:   DogOptions{Mogrifiers: mogrifiers(t, hitsEnv, "CONFIG", "HITS")},
			extra: map[string]string{"cluster": "eg"},
			want: []string{
				"ratelimit.service.rate_limit.total_hits:3|c|#cluster:eg,domain:d,descriptor:key_value",
				"ratelimit.service.rate_limit.over_limit:1|c|#cluster:eg,domain:d,descriptor:key_value",
				"tollgate.config_load_success:1|c|#cluster:eg,kind:config_load_success,whole:ratelimit.service.config_load_success,past:$7",
				// The HITS pattern wants three parts after rate_limit.
				"ratelimit.service.call.should_rate_limit.service_error:1|c|#cluster:eg",
				"ratelimit_server.ShouldRateLimit.total_requests:1|c|#cluster:eg",
				"ratelimit.redis_pool.cx_active:2|g|#cluster:eg",
				"ratelimit.redis_pool.cx_total:5|c|#cluster:eg",
				"ratelimit.redis_pool.cx_local_close:3|c|#cluster:eg",
				"ratelimit.service.rate_limit.within_limit:2|c|#cluster:eg,domain:d,descriptor:key_value",
			},
			timer: `ratelimit_server\.ShouldRateLimit\.response_time:\d+\.000000\|ms\|#cluster:eg`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := listenAgent(t)
			s, err := NewDogStatsd(a.addr, tc.dog, Options{Flush: time.Hour, Tags: tc.extra})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			opened, open := uint64(5), uint64(2)
			s.RedisPool(func() uint64 { return opened }, func() uint64 { return open })
			s.AddHits("d", "d.key_value", false, [5]uint64{3, 1, 0, 2, 0})
			s.ConfigLoad(true)
			s.CallFailed(false)
			s.Call("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")()
			s.Flush()
			got := a.linesUntil(t, tc.want...)
			timer := regexp.MustCompile("^" + tc.timer + "$")
			if !slices.ContainsFunc(got, timer.MatchString) {
				// The timer is sent within 100 ms, perhaps after the flush.
				got = append(got, a.linesUntilMatch(t, timer)...)
			}
			for _, l := range got {
				if !slices.Contains(tc.want, l) && !timer.MatchString(l) {
					t.Errorf("line %q, not one of %q", l, tc.want)
				}
			}
		})
	}
}

// linesUntilMatch reads lines until one matches re, or fails after 10 s.
func (a *agent) linesUntilMatch(t *testing.T, re *regexp.Regexp) []string {
	t.Helper()
	var seen []string
	deadline := time.After(10 * time.Second)
	for {
		select {
		case d := <-a.got:
			for _, l := range strings.Split(strings.TrimSuffix(string(d), "\n"), "\n") {
				if strings.HasPrefix(l, "ratelimit.go.") {
					continue
				}
				seen = append(seen, l)
				if re.MatchString(l) {
					return seen
				}
			}
		case <-deadline:
			t.Fatalf("no line matching %s; came: %q", re, seen)
		}
	}
}

// TestDogSinkDatagram: what each kind of statistic is in a datagram, byte
// for byte, as Datadog's client writes it for envoy.
func TestDogSinkDatagram(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		send func(s *dogSink)
		want string
	}{
		{"counter", func(s *dogSink) { s.FlushCounter("a.b", 7) }, "a.b:7|c\n"},
		{"gauge", func(s *dogSink) { s.FlushGauge("a.g", 1234567) }, "a.g:1234567|g\n"},
		{"timer", func(s *dogSink) { s.FlushTimer("a.t", 12.9) }, "a.t:12.000000|ms\n"},
		{"timer 0", func(s *dogSink) { s.FlushTimer("a.t", 0) }, "a.t:0.000000|ms\n"},
		{"gostats tags", func(s *dogSink) { s.FlushCounter("a.b.__k=v.__z=1", 1) }, "a.b:1|c|#k:v,z:1\n"},
		{"a malformed gostats tag is left out", func(s *dogSink) { s.FlushCounter("a.b.__k.__z=1", 1) }, "a.b:1|c|#z:1\n"},
		{"several, one datagram", func(s *dogSink) {
			s.FlushCounter("a", 1)
			s.FlushGauge("b", 2)
			s.FlushTimer("c", 3)
		}, "a:1|c\nb:2|g\nc:3.000000|ms\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := listenAgent(t)
			s := dialSink(t, a.addr, nil)
			tc.send(s)
			s.Flush()
			if got := string(a.datagram(t)); got != tc.want {
				t.Errorf("datagram %q, want %q", got, tc.want)
			}
		})
	}
}

func dialSink(t *testing.T, addr string, log *slog.Logger) *dogSink {
	t.Helper()
	conn, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if log == nil {
		log = slog.Default()
	}
	s := &dogSink{conn: conn, log: log}
	t.Cleanup(s.close)
	return s
}

// TestDogSinkDatagramSize: lines are gathered into datagrams of at most
// 1,432 bytes, each whole; one longer than that is dropped, and logged
// once.
func TestDogSinkDatagramSize(t *testing.T) {
	t.Parallel()
	a := listenAgent(t)
	var log bytes.Buffer
	s := dialSink(t, a.addr, slog.New(slog.NewTextHandler(&log, nil)))
	var want []string
	for i := range 40 {
		name := strings.Repeat("n", 90) + "." + string(rune('a'+i%26)) + strings.Repeat("x", i)
		s.FlushCounter(name, uint64(i))
		want = append(want, name+":"+strconv.Itoa(i)+"|c")
	}
	long := strings.Repeat("l", dogDatagram)
	s.FlushCounter(long, 1)
	s.FlushCounter(long+"2", 1)
	s.Flush()
	got := a.linesUntil(t, want...)
	if len(got) != len(want) {
		t.Errorf("%d lines, want %d", len(got), len(want))
	}
	if n := strings.Count(log.String(), "longer than a datagram"); n != 1 {
		t.Errorf("the drop logged %d times, want once:\n%s", n, log.String())
	}
	s.close()
	s.FlushCounter("after.close", 1) // a call still ending: dropped, no panic
}

// TestDogSinkMogrify: a name, and the name and tags it is sent as.
func TestDogSinkMogrify(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"DOG_STATSD_MOGRIFIER_FOO_PATTERN":      `^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.foo$`,
		"DOG_STATSD_MOGRIFIER_FOO_NAME":         "custom.foo",
		"DOG_STATSD_MOGRIFIER_FOO_TAGS":         "domain:$1,descriptor:$2",
		"DOG_STATSD_MOGRIFIER_WILDCARD_PATTERN": `^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$`,
		"DOG_STATSD_MOGRIFIER_WILDCARD_NAME":    "ratelimit.service.rate_limit.$3",
		"DOG_STATSD_MOGRIFIER_WILDCARD_TAGS":    "domain:$1,descriptor:$5",
	}
	s := &dogSink{mogrifiers: mogrifiers(t, env, "FOO", "wildcard"), tags: []string{"env:prod"}}
	for _, tc := range []struct {
		in, wantName string
		wantTags     []string
	}{
		{"ratelimit.service.rate_limit.mongo_cps.database_users.foo", "custom.foo", []string{"env:prod", "domain:mongo_cps", "descriptor:database_users"}},
		{"ratelimit.service.rate_limit.mongo_cps.database_users.within_limit", "ratelimit.service.rate_limit.within_limit", []string{"env:prod", "domain:mongo_cps", "descriptor:$5"}},
		{"ratelimit.service.rate_limit.d.k.total_hits.__cluster=eg", "ratelimit.service.rate_limit.total_hits", []string{"env:prod", "cluster:eg", "domain:d", "descriptor:$5"}},
		{"some.unmatched.metric", "some.unmatched.metric", []string{"env:prod"}},
		{"some.unmatched.metric.__a=1.__b=2", "some.unmatched.metric", []string{"env:prod", "a:1", "b:2"}},
	} {
		gotName, gotTags := s.mogrify(tc.in)
		if gotName != tc.wantName || !slices.Equal(gotTags, tc.wantTags) {
			t.Errorf("%s: %s %q, want %s %q", tc.in, gotName, gotTags, tc.wantName, tc.wantTags)
		}
	}
}

func TestMogrifierNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"  ", nil},
		{"HITS", []string{"HITS"}},
		{"DOMAIN,HITS", []string{"DOMAIN", "HITS"}},
		{"DOMAIN, HITS", []string{"DOMAIN", " HITS"}}, // as envoy: refused by MogrifiersFromEnv
		{"A,,B", []string{"A", "", "B"}},
	} {
		if got := MogrifierNames(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("MogrifierNames(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestMogrifiersFromEnv: what a mogrifier's variables make.
func TestMogrifiersFromEnv(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		label string
		env   map[string]string
		want  Mogrifier // Pattern as its text
	}{
		{"upper-cased variables", "hits", map[string]string{
			"DOG_STATSD_MOGRIFIER_HITS_PATTERN": `^a\.(b)$`, "DOG_STATSD_MOGRIFIER_HITS_NAME": "a", "DOG_STATSD_MOGRIFIER_HITS_TAGS": "z:$1,a:2",
		}, Mogrifier{Label: "hits", Pattern: regexp.MustCompile(`^a\.(b)$`), Name: "a", Tags: []Tag{{"z", "$1"}, {"a", "2"}}}},
		{"no tags", "N", map[string]string{"DOG_STATSD_MOGRIFIER_N_PATTERN": "x", "DOG_STATSD_MOGRIFIER_N_NAME": "y"},
			Mogrifier{Label: "N", Pattern: regexp.MustCompile("x"), Name: "y"}},
		{"blank tags", "N", map[string]string{"DOG_STATSD_MOGRIFIER_N_PATTERN": "x", "DOG_STATSD_MOGRIFIER_N_NAME": "y", "DOG_STATSD_MOGRIFIER_N_TAGS": " "},
			Mogrifier{Label: "N", Pattern: regexp.MustCompile("x"), Name: "y"}},
		{"a key twice: the last value", "N", map[string]string{"DOG_STATSD_MOGRIFIER_N_PATTERN": "x", "DOG_STATSD_MOGRIFIER_N_NAME": "y", "DOG_STATSD_MOGRIFIER_N_TAGS": "k:1,j:2,k:3"},
			Mogrifier{Label: "N", Pattern: regexp.MustCompile("x"), Name: "y", Tags: []Tag{{"k", "3"}, {"j", "2"}}}},
	} {
		got, err := MogrifiersFromEnv([]string{tc.label}, func(k string) string { return tc.env[k] })
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		g := got[0]
		if g.Label != tc.want.Label || g.Pattern.String() != tc.want.Pattern.String() || g.Name != tc.want.Name || !slices.Equal(g.Tags, tc.want.Tags) {
			t.Errorf("%s: %+v, want %+v", tc.name, g, tc.want)
		}
	}
	if got, err := MogrifiersFromEnv(nil, func(string) string { return "" }); err != nil || len(got) != 0 {
		t.Errorf("no mogrifiers: %v, %v; want none and no error", got, err)
	}
}

func TestMogrifiersFromEnvRefuses(t *testing.T) {
	t.Parallel()
	ok := map[string]string{"DOG_STATSD_MOGRIFIER_A_PATTERN": "x", "DOG_STATSD_MOGRIFIER_A_NAME": "n"}
	with := func(k, v string) map[string]string {
		m := map[string]string{k: v}
		for kk, vv := range ok {
			if kk != k {
				m[kk] = vv
			}
		}
		return m
	}
	for _, tc := range []struct {
		names []string
		env   map[string]string
		want  string
	}{
		{[]string{"A"}, map[string]string{}, "statsd: mogrifier A: no DOG_STATSD_MOGRIFIER_A_PATTERN"},
		{[]string{"A"}, map[string]string{"DOG_STATSD_MOGRIFIER_A_NAME": "n"}, "statsd: mogrifier A: no DOG_STATSD_MOGRIFIER_A_PATTERN"},
		{[]string{"A"}, with("DOG_STATSD_MOGRIFIER_A_PATTERN", "("), "statsd: mogrifier A: DOG_STATSD_MOGRIFIER_A_PATTERN: error parsing regexp: missing closing )"},
		{[]string{"A"}, map[string]string{"DOG_STATSD_MOGRIFIER_A_PATTERN": "x"}, "statsd: mogrifier A: no DOG_STATSD_MOGRIFIER_A_NAME"},
		{[]string{"A"}, with("DOG_STATSD_MOGRIFIER_A_NAME", "a:b"), `DOG_STATSD_MOGRIFIER_A_NAME "a:b": ':' would break a DogStatsD line`},
		{[]string{"A"}, with("DOG_STATSD_MOGRIFIER_A_NAME", "a|b"), `'|' would break`},
		{[]string{"A"}, with("DOG_STATSD_MOGRIFIER_A_NAME", "a\nb"), `the control character U+000A would break`},
		{[]string{"A"}, with("DOG_STATSD_MOGRIFIER_A_TAGS", "k"), `DOG_STATSD_MOGRIFIER_A_TAGS: "k": want key:value,key:value`},
		{[]string{"A"}, with("DOG_STATSD_MOGRIFIER_A_TAGS", "k:v:w"), `"k:v:w": want key:value,key:value`},
		{[]string{"A"}, with("DOG_STATSD_MOGRIFIER_A_TAGS", "k:"), `"k:": want a key and a value`},
		{[]string{"A"}, with("DOG_STATSD_MOGRIFIER_A_TAGS", ":5"), `":5": want a key and a value`},
		{[]string{"A"}, with("DOG_STATSD_MOGRIFIER_A_TAGS", "a:1,"), `"": want key:value`},
		{[]string{"A"}, with("DOG_STATSD_MOGRIFIER_A_TAGS", "k:v|x"), `'|' would break`},
		{[]string{"A"}, with("DOG_STATSD_MOGRIFIER_A_PATTERN", strings.Repeat("x", MaxMogrifierBytes+1)), "DOG_STATSD_MOGRIFIER_A_PATTERN: 4097 bytes, more than the limit of 4096"},
		{[]string{" A"}, ok, `statsd: mogrifier " A": want a name of letters, digits and _`},
		{[]string{""}, ok, `statsd: mogrifier "": want a name`},
		{[]string{"A-B"}, ok, `statsd: mogrifier "A-B": want a name`},
		{[]string{"A", "B"}, ok, "statsd: mogrifier B: no DOG_STATSD_MOGRIFIER_B_PATTERN"},
		{make([]string, MaxMogrifiers+1), ok, "statsd: 65 mogrifiers, more than the limit of 64"},
	} {
		_, err := MogrifiersFromEnv(tc.names, func(k string) string { return tc.env[k] })
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q %q: %v, want an error saying %s", tc.names, tc.env, err, tc.want)
		}
	}
}

func TestDatadogEnvTags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		want []string
	}{
		{nil, nil},
		{map[string]string{"DD_VERSION": "1.2", "DD_ENV": "prod", "DD_SERVICE": "rl", "DD_ENTITY_ID": "pod-uid", "DD_TAGS": "a:b"},
			[]string{"dd.internal.entity_id:pod-uid", "env:prod", "service:rl", "version:1.2"}},
		{map[string]string{"DD_ENV": "staging"}, []string{"env:staging"}},
	} {
		if got := DatadogEnvTags(func(k string) string { return tc.env[k] }); !slices.Equal(got, tc.want) {
			t.Errorf("%v: %q, want %q", tc.env, got, tc.want)
		}
	}
}

func TestNewDogStatsdRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr string
		dog  DogOptions
		want string
	}{
		{"localhost", DogOptions{}, `statsd: address "localhost": want host:port`},
		{"localhost:0", DogOptions{}, `statsd: address "localhost:0": want a port number`},
		{"localhost:dogstatsd", DogOptions{}, "want a port number"},
		{"127.0.0.1:8125", DogOptions{Mogrifiers: make([]Mogrifier, MaxMogrifiers+1)}, "statsd: 65 mogrifiers"},
	} {
		if _, err := NewDogStatsd(tc.addr, tc.dog, Options{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %s", tc.addr, err, tc.want)
		}
	}
}
