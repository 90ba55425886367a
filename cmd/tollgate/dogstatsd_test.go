package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// dogAgent is a DogStatsD agent of the test's own: a UDP socket on a free
// loopback port, and every line it is sent.
type dogAgent struct {
	port  string
	lines chan string
}

func listenDogAgent(t *testing.T) *dogAgent {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	_, port, _ := net.SplitHostPort(pc.LocalAddr().String())
	a := &dogAgent{port: port, lines: make(chan string, 65536)}
	go func() {
		buf := make([]byte, 65536)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			d := string(buf[:n])
			if len(d) > 1432 || !strings.HasSuffix(d, "\n") {
				a.lines <- "bad datagram: " + strconv.Quote(d)
				continue
			}
			for _, l := range strings.Split(strings.TrimSuffix(d, "\n"), "\n") {
				a.lines <- l
			}
		}
	}()
	return a
}

// dogLine is a DogStatsD line of envoy's: name:value|type, and its tags.
var dogLine = regexp.MustCompile(`^([^:|#]+):([0-9]+(?:\.[0-9]{6})?)\|(c|g|ms)(\|#[^|]+)?$`)

// sums reads lines until the counters and the timers' counts (name|type|#tags,
// the counters summed over the flushes) are at least want, or fails
// after 20 s; a line that is no DogStatsD line fails the test. It
// returns what came, the Go runtime's statistics left out.
func (a *dogAgent) sums(t *testing.T, want map[string]float64) map[string]float64 {
	t.Helper()
	got := map[string]float64{}
	deadline := time.After(20 * time.Second)
	for {
		done := true
		for k, w := range want {
			if got[k] < w {
				done = false
			}
		}
		if done {
			return got
		}
		select {
		case l := <-a.lines:
			m := dogLine.FindStringSubmatch(l)
			if m == nil {
				t.Fatalf("%q: no DogStatsD line", l)
			}
			if strings.HasPrefix(m[1], "ratelimit.go.") {
				continue
			}
			key := m[1] + "|" + m[3] + m[4]
			switch m[3] {
			case "c":
				v, _ := strconv.ParseFloat(m[2], 64)
				got[key] += v
			case "ms":
				got[key]++ // the timers' count
			case "g":
				v, _ := strconv.ParseFloat(m[2], 64)
				got[key] = v
			}
		case <-deadline:
			t.Fatalf("after 20s, got %v\nwant at least %v", got, want)
		}
	}
}

// dogMogrifiers are the README's HITS mogrifier, and one for an unknown
// domain's statistic, named in lower case.
var dogMogrifiers = []string{
	"USE_DOG_STATSD_MOGRIFIERS=notfound,HITS",
	`DOG_STATSD_MOGRIFIER_HITS_PATTERN=^ratelimit\.service\.rate_limit\.([^.]+)\.(.*)\.([^.]+)$`,
	"DOG_STATSD_MOGRIFIER_HITS_NAME=ratelimit.service.rate_limit.$3",
	"DOG_STATSD_MOGRIFIER_HITS_TAGS=domain:$1,descriptor:$2",
	`DOG_STATSD_MOGRIFIER_NOTFOUND_PATTERN=^ratelimit\.service\.rate_limit\.([^.]+)\.domain_not_found$`,
	"DOG_STATSD_MOGRIFIER_NOTFOUND_NAME=ratelimit.service.domain_not_found",
	"DOG_STATSD_MOGRIFIER_NOTFOUND_TAGS=domain:$1",
}

// TestDogStatsd runs tollgate with envoy's DogStatsD environment
// (USE_DOG_STATSD, STATSD_HOST, STATSD_PORT, the mogrifiers, EXTRA_TAGS,
// and Datadog's DD_ENV and DD_SERVICE) and an agent on loopback: the
// statistics come in DogStatsD's lines, renamed and tagged.
func TestDogStatsd(t *testing.T) {
	t.Parallel()
	const rules = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"
	const tags = "env:test,service:ratelimit,cluster:eg"
	for _, tc := range []struct {
		name   string
		env    []string
		logged string // the mogrifiers, in the log
		want   map[string]float64
	}{
		{"mogrified", dogMogrifiers, "notfound,HITS", map[string]float64{
			"ratelimit.service.rate_limit.total_hits|c|#" + tags + ",domain:d,descriptor:user":   3,
			"ratelimit.service.rate_limit.within_limit|c|#" + tags + ",domain:d,descriptor:user": 2,
			"ratelimit.service.rate_limit.over_limit|c|#" + tags + ",domain:d,descriptor:user":   1,
			"ratelimit.service.domain_not_found|c|#" + tags + ",domain:nowhere":                  1,
			"ratelimit.service.config_load_success|c|#" + tags:                                   1,
			"ratelimit_server.ShouldRateLimit.total_requests|c|#" + tags:                         4,
			"ratelimit_server.ShouldRateLimit.response_time|ms|#" + tags:                         4,
		}},
		{"as envoy names them", nil, `""`, map[string]float64{
			"ratelimit.service.rate_limit.d.user.total_hits|c|#" + tags:        3,
			"ratelimit.service.rate_limit.d.user.within_limit|c|#" + tags:      2,
			"ratelimit.service.rate_limit.d.user.over_limit|c|#" + tags:        1,
			"ratelimit.service.rate_limit.nowhere.domain_not_found|c|#" + tags: 1,
			"ratelimit.service.config_load_success|c|#" + tags:                 1,
			"ratelimit_server.ShouldRateLimit.total_requests|c|#" + tags:       4,
			"ratelimit_server.ShouldRateLimit.response_time|ms|#" + tags:       4,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := listenDogAgent(t)
			env := statsEnv(runtimeTree(t, rules), append([]string{"USE_STATSD=false", "USE_DOG_STATSD=true", "STATSD_HOST=127.0.0.1",
				"STATSD_PORT=" + a.port, "EXTRA_TAGS=cluster:eg", "DD_ENV=test", "DD_SERVICE=ratelimit"}, tc.env...)...)
			p := startEnv(t, env)
			user := "u-" + randomID()
			for i, want := range []string{"OK: OK", "OK: OK", "OVER_LIMIT: OVER_LIMIT"} {
				if got := codesOf(p.ask(request("d", desc("user", user)))); got != want {
					t.Fatalf("request %d: %s, want %s", i+1, got, want)
				}
			}
			p.ask(request("nowhere", desc("user", user)))
			got := a.sums(t, tc.want)
			for _, k := range slices.Sorted(maps.Keys(got)) {
				if w, ok := tc.want[k]; ok && got[k] != w {
					t.Errorf("%s = %v, want %v", k, got[k], w)
				}
				if !strings.HasSuffix(k, "|#"+tags) && !strings.Contains(k, "|#"+tags+",") {
					t.Errorf("%s: without the tags %s", k, tags)
				}
			}
			if m := p.log.waitFor(t, regexp.MustCompile(`msg="statistics to dogstatsd" addr=(\S+) protocol=udp mogrifiers=(\S+) tags=(\S+)`), 5*time.Second); m[1] != "127.0.0.1:"+a.port || m[2] != tc.logged || m[3] != "env:test,service:ratelimit" {
				t.Errorf("logged %q", m[0])
			}
		})
	}
}

// TestDogStatsdRefused: wrong mogrifiers stop tollgate before it starts,
// with exit status 2 and the variable named.
func TestDogStatsdRefused(t *testing.T) {
	t.Parallel()
	root := runtimeTree(t, envoyEnvRules)
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"USE_DOG_STATSD_MOGRIFIERS=HITS"}, `--dogstatsd-mogrifiers "HITS": statsd: mogrifier HITS: no DOG_STATSD_MOGRIFIER_HITS_PATTERN`},
		{[]string{"USE_DOG_STATSD_MOGRIFIERS=hits", "DOG_STATSD_MOGRIFIER_HITS_PATTERN=(", "DOG_STATSD_MOGRIFIER_HITS_NAME=n"},
			"statsd: mogrifier hits: DOG_STATSD_MOGRIFIER_HITS_PATTERN: error parsing regexp: missing closing ): `(`"},
		{[]string{"USE_DOG_STATSD_MOGRIFIERS=HITS", "DOG_STATSD_MOGRIFIER_HITS_PATTERN=x"}, "statsd: mogrifier HITS: no DOG_STATSD_MOGRIFIER_HITS_NAME"},
		{[]string{"USE_DOG_STATSD_MOGRIFIERS=HITS", "DOG_STATSD_MOGRIFIER_HITS_PATTERN=x", "DOG_STATSD_MOGRIFIER_HITS_NAME=n", "DOG_STATSD_MOGRIFIER_HITS_TAGS=domain"},
			`statsd: mogrifier HITS: DOG_STATSD_MOGRIFIER_HITS_TAGS: "domain": want key:value,key:value`},
		{append(slices.Clone(dogMogrifiers[1:]), "USE_DOG_STATSD_MOGRIFIERS=NOTFOUND, HITS"), `statsd: mogrifier " HITS": want a name of letters, digits and _`},
		{[]string{"USE_PROMETHEUS=true"}, "USE_DOG_STATSD=true and USE_PROMETHEUS=true"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			t.Parallel()
			env := append(composeEnv("", root, "USE_DOG_STATSD=true", "STATSD_HOST=127.0.0.1"), tc.env...)
			bin := tollgateBinary(t) // built first: the deadline is the run's
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "serve")
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 2 {
				t.Fatalf("exit: %v, want status 2; output:\n%s", err, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("output does not say %s:\n%s", tc.want, out)
			}
			if strings.Contains(string(out), "level=") {
				t.Errorf("refused only after starting:\n%s", out)
			}
		})
	}
}

// TestDogStatsdFlags: the same without envoy's environment, with
// --dogstatsd and --dogstatsd-mogrifiers.
func TestDogStatsdFlags(t *testing.T) {
	t.Parallel()
	a := listenDogAgent(t)
	root := runtimeTree(t, envoyEnvRules)
	p := startEnv(t, append(slices.Clone(dogMogrifiers[1:]), "PATH=/usr/bin:/bin"), "--config", root+"/ratelimit/config",
		"--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--dogstatsd", "127.0.0.1:"+a.port, "--dogstatsd-mogrifiers", "HITS",
		"--stats-flush", "200ms", "--stats-tags", "cluster:eg")
	user := "u-" + randomID()
	p.ask(request("rl", desc("user", user)))
	a.sums(t, map[string]float64{
		"ratelimit.service.rate_limit.total_hits|c|#cluster:eg,domain:rl,descriptor:user": 1,
		"ratelimit_server.ShouldRateLimit.total_requests|c|#cluster:eg":                   1,
	})
	if strings.Contains(p.log.String(), "envoyproxy/ratelimit environment") {
		t.Errorf("in envoy mode, with flags only:\n%s", p.log.String())
	}
}

func TestStatsFlagsCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		flags statsFlags
		want  string // "" for none
	}{
		{statsFlags{dogstatsd: "127.0.0.1:8125"}, ""},
		{statsFlags{dogstatsd: "127.0.0.1:8125", mogrifiers: "HITS"}, ""},
		{statsFlags{statsd: "127.0.0.1:8125", dogstatsd: "127.0.0.1:8125"}, "--statsd, --dogstatsd and --prometheus-mapper: one at most"},
		{statsFlags{dogstatsd: "127.0.0.1:8125", mapper: "m.yaml"}, "one at most"},
		{statsFlags{statsd: "127.0.0.1:8125", mogrifiers: "HITS"}, "--dogstatsd-mogrifiers is for --dogstatsd"},
	} {
		tc.flags.flush = time.Second
		err := tc.flags.check()
		if got := fmt.Sprint(err); (tc.want == "" && err != nil) || (tc.want != "" && !strings.Contains(got, tc.want)) {
			t.Errorf("%+v: %v, want %q", tc.flags, err, tc.want)
		}
	}
}
