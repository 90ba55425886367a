package statsd

import (
	"bufio"
	"context"
	"net"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tollgate/tollgate/internal/service/series"
)

// lines is a statsd server of the test's own on a free loopback port: it
// collects every line it is sent, over TCP or UDP.
type lines struct {
	addr string
	got  chan string
}

func listen(t *testing.T, protocol string) *lines {
	t.Helper()
	l := &lines{got: make(chan string, 4096)}
	switch protocol {
	case "tcp":
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		l.addr = ln.Addr().String()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go l.scan(c)
			}
		}()
	case "udp":
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
		l.addr = pc.LocalAddr().String()
		go func() {
			buf := make([]byte, 65536)
			for {
				n, _, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				for _, line := range strings.Split(strings.TrimSpace(string(buf[:n])), "\n") {
					l.got <- line
				}
			}
		}()
	}
	return l
}

func (l *lines) scan(c net.Conn) {
	defer c.Close()
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		l.got <- sc.Text()
	}
}

// waitFor collects lines until every one of want has come (in any order),
// or fails after 5 s; it returns every line that came, but the Go
// runtime's.
func (l *lines) waitFor(t *testing.T, want ...string) []string {
	t.Helper()
	var seen []string
	deadline := time.After(5 * time.Second)
	for {
		missing := slices.DeleteFunc(slices.Clone(want), func(w string) bool { return slices.Contains(seen, w) })
		if len(missing) == 0 {
			return seen
		}
		select {
		case line := <-l.got:
			if !strings.HasPrefix(line, "ratelimit.go.") {
				seen = append(seen, line)
			}
		case <-deadline:
			t.Fatalf("lines %q did not come; came: %q", missing, seen)
		}
	}
}

func TestStatsdLines(t *testing.T) {
	t.Parallel()
	for _, protocol := range []string{"tcp", "udp"} {
		t.Run(protocol, func(t *testing.T) {
			t.Parallel()
			srv := listen(t, protocol)
			s, err := NewStatsd(srv.addr, protocol, Options{Flush: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			s.AddHits("d", "d.key_value.inner", false, [5]uint64{3, 1, 2, 2, 0})
			s.AddHits("d", "d.key_value.inner", false, [5]uint64{1, 0, 0, 1, 0})
			s.ConfigLoad(true)
			s.CallFailed(false)
			s.DomainNotFound("nope")
			s.Call("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")()
			s.Flush()
			got := srv.waitFor(t,
				"ratelimit.service.rate_limit.d.key_value.inner.total_hits:4|c",
				"ratelimit.service.rate_limit.d.key_value.inner.over_limit:1|c",
				"ratelimit.service.rate_limit.d.key_value.inner.near_limit:2|c",
				"ratelimit.service.rate_limit.d.key_value.inner.within_limit:3|c",
				"ratelimit.service.rate_limit.nope.domain_not_found:1|c",
				"ratelimit.service.config_load_success:1|c",
				"ratelimit.service.call.should_rate_limit.service_error:1|c",
				"ratelimit_server.ShouldRateLimit.total_requests:1|c",
				"ratelimit_server.ShouldRateLimit.response_time:0|ms",
			)
			for _, line := range got {
				if strings.Contains(line, "shadow_mode") || strings.Contains(line, "config_load_error") {
					t.Errorf("%q: a counter that did not change is sent", line)
				}
			}
			// Counters are sent as what they grew by since the last flush,
			// and only when they grew.
			s.AddHits("d", "d.key_value.inner", false, [5]uint64{2, 0, 0, 2, 0})
			s.Flush()
			got = srv.waitFor(t, "ratelimit.service.rate_limit.d.key_value.inner.total_hits:2|c",
				"ratelimit.service.rate_limit.d.key_value.inner.within_limit:2|c")
			for _, line := range got {
				if !strings.Contains(line, "key_value.inner.total_hits") && !strings.Contains(line, "key_value.inner.within_limit") {
					t.Errorf("%q: sent again, unchanged", line)
				}
			}
		})
	}
}

func TestStatsdTags(t *testing.T) {
	t.Parallel()
	srv := listen(t, "tcp")
	s, err := NewStatsd(srv.addr, "tcp", Options{Flush: time.Hour, Tags: map[string]string{"env": "prod", "az": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	s.AddHits("d", "d.k", false, [5]uint64{1, 0, 0, 1, 0})
	s.Call("/grpc.health.v1.Health/Check")()
	s.Flush()
	srv.waitFor(t, "ratelimit.service.rate_limit.d.k.total_hits.__az=b.__env=prod:1|c",
		"ratelimit_server.Check.total_requests.__az=b.__env=prod:1|c")
}

// TestStatsdRun: Run flushes every interval, and once more when its
// context ends.
func TestStatsdRun(t *testing.T) {
	t.Parallel()
	srv := listen(t, "tcp")
	s, err := NewStatsd(srv.addr, "tcp", Options{Flush: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go s.Run(ctx)
	s.ConfigLoad(true)
	srv.waitFor(t, "ratelimit.service.config_load_success:1|c")
	s.ConfigLoad(false)
	cancel()
	s.Close()
	srv.waitFor(t, "ratelimit.service.config_load_error:1|c")
}

func TestNewStatsdRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ addr, protocol, want string }{
		{"localhost", "tcp", "host:port"},
		{"localhost:http", "tcp", "port number"},
		{"localhost:0", "tcp", "port number"},
		{"localhost:8125", "sctp", "tcp or udp"},
	} {
		if _, err := NewStatsd(tc.addr, tc.protocol, Options{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewStatsd(%q, %q): %v, want an error saying %q", tc.addr, tc.protocol, err, tc.want)
		}
	}
}

func TestCheckGostatsEnv(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		want string // "" for no error
	}{
		{map[string]string{}, ""},
		{map[string]string{"USE_STATSD": "True", "STATSD_PORT": "9125", "GOSTATS_FLUSH_INTERVAL_SECONDS": "5"}, ""},
		{map[string]string{"GOSTATS_FLUSH_INTERVAL_SECONDS": "5s"}, `GOSTATS_FLUSH_INTERVAL_SECONDS="5s"`},
		{map[string]string{"GOSTATS_LOGGING_SINK_DISABLED": "yes"}, `GOSTATS_LOGGING_SINK_DISABLED="yes"`},
		{map[string]string{"STATSD_PORT": "statsd"}, `STATSD_PORT="statsd"`},
	} {
		err := checkGostatsEnv(func(k string) string { return tc.env[k] })
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v, want no error", tc.env, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: %v, want an error saying %s", tc.env, err, tc.want)
		}
	}
}

func TestSanitize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"d.key_value.inner", "d.key_value.inner"},
		{"d.a:b|c", "d.a_b_c"},
		{"d.remote_address_10.0.0.1", "d.remote_address_10_0_0_1"},
		{"d.remote_address_10.0.0.1.path_/x", "d.remote_address_10_0_0_1.path_/x"},
		{"d.k_v\nevil.metric:999|c", "d.k_v_evil.metric_999_c"},
		{"d.k_v,tag=x#t:y[a=b]", "d.k_v_tag=x_t_y_a=b_"},
		{"d.1.2.3", "d.1.2.3"},
		{"httproute/default/r/rule/0/match/0_httproute/default/r/rule/0/match/0", "httproute/default/r/rule/0/match/0_httproute/default/r/rule/0/match/0"},
	} {
		if got := sanitize(tc.in); got != tc.want {
			t.Errorf("sanitize(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestStatsdBound: names made from callers' values are bounded; past the
// bound their hits are counted under the domain's overflow name, and the
// bound counts them. Rules' own names are not bounded.
func TestStatsdBound(t *testing.T) {
	t.Parallel()
	srv := listen(t, "tcp")
	s, err := NewStatsd(srv.addr, "tcp", Options{Flush: time.Hour, Bound: series.New(2, 0)})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"a", "b", "c", "d"} {
		s.AddHits("dom", "dom.user_"+v, true, [5]uint64{1, 0, 0, 1, 0})
	}
	s.AddHits("dom", "dom.route", false, [5]uint64{1, 0, 0, 1, 0})
	s.DomainNotFound("other")
	s.Flush()
	got := srv.waitFor(t,
		"ratelimit.service.rate_limit.dom.user_a.total_hits:1|c",
		"ratelimit.service.rate_limit.dom.user_b.total_hits:1|c",
		"ratelimit.service.rate_limit.dom.__overflow__.total_hits:2|c",
		"ratelimit.service.rate_limit.dom.route.total_hits:1|c",
		"ratelimit.service.rate_limit.__overflow__.domain_not_found:1|c",
	)
	for _, line := range got {
		if strings.Contains(line, "user_c") || strings.Contains(line, "user_d") {
			t.Errorf("%q: past the bound", line)
		}
	}
	if got, want := s.Bound().Folded(), uint64(3); got != want {
		t.Errorf("folded %d, want %d", got, want)
	}
}

// TestMapped runs Envoy Gateway's mapping in process, as
// PROMETHEUS_MAPPER_YAML does, and reads the series it makes.
func TestMapped(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	s, err := NewMapped("testdata/envoy-gateway-v1.0-v1.2.yaml", reg, Options{Flush: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.AddHits("d", "d.route_route.rule-0-match-0", false, [5]uint64{5, 2, 1, 3, 0})
	s.AddHits("d", "d.outer", false, [5]uint64{1, 0, 0, 1, 0})
	s.ConfigLoad(true)
	s.CallFailed(true)
	s.Call("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")()
	s.Flush()
	want := map[string]float64{
		`ratelimit_service_rate_limit_total_hits{domain="d",key1="route_route",key2="rule-0-match-0"}`:   5,
		`ratelimit_service_rate_limit_over_limit{domain="d",key1="route_route",key2="rule-0-match-0"}`:   2,
		`ratelimit_service_rate_limit_near_limit{domain="d",key1="route_route",key2="rule-0-match-0"}`:   1,
		`ratelimit_service_rate_limit_within_limit{domain="d",key1="route_route",key2="rule-0-match-0"}`: 3,
		`ratelimit_service_rate_limit_total_hits{domain="d",key1="outer"}`:                               1,
		`ratelimit_service_rate_limit_within_limit{domain="d",key1="outer"}`:                             1,
		`ratelimit_service_config_load_success`:                                                          1,
		`ratelimit_service_should_rate_limit_error{err_type="redis_error"}`:                              1,
		`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}`:                                1,
		`ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"}`:                   1,
	}
	var got map[string]float64
	deadline := time.Now().Add(5 * time.Second)
	for {
		got = gather(t, reg, "ratelimit_")
		if len(got) == len(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: a series the mapping should not make (the v1.0 mapping drops the rest)", k)
		}
	}
	if got := gather(t, reg, "statsd_exporter_events_actions_total"); got[`statsd_exporter_events_actions_total{action="drop"}`] == 0 {
		t.Errorf("statsd_exporter_events_actions_total: %v, want drops (the runtime's gauges)", got)
	}
}

func TestNewMappedRefuses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := dir + "/bad.yaml"
	writeFile(t, bad, "mappings:\n  - match: \"a.*\"\n    name: \"1bad name\"\n")
	big := dir + "/big.yaml"
	writeFile(t, big, "# "+strings.Repeat("x", MaxMappingBytes)+"\nmappings: []\n")
	for _, tc := range []struct{ file, want string }{
		{dir + "/none.yaml", "no such file"},
		{dir, "not a regular file"},
		{bad, "bad.yaml"},
		{big, "over 1048576 bytes"},
	} {
		if _, err := NewMapped(tc.file, prometheus.NewRegistry(), Options{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewMapped(%s): %v, want an error saying %q", tc.file, err, tc.want)
		}
	}
}

// gather returns the registry's series whose names start with prefix, as
// name{labels} → value (a histogram as its _count).
func gather(t *testing.T, reg *prometheus.Registry, prefix string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), prefix) {
			continue
		}
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			var v float64
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				v = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				v = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				name += "_count"
				v = float64(m.GetHistogram().GetSampleCount())
			default:
				continue
			}
			out[name+labels(m)] = v
		}
	}
	return out
}

func labels(m *dto.Metric) string {
	if len(m.GetLabel()) == 0 {
		return ""
	}
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, l.GetName()+`="`+l.GetValue()+`"`)
	}
	slices.Sort(parts)
	return "{" + strings.Join(parts, ",") + "}"
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestStatsdRedisPool: the Redis pool's statistics, made at each flush
// from the connections opened and open: the gauge of those open, and what
// the counters of those opened and closed grew by, never less than 0.
func TestStatsdRedisPool(t *testing.T) {
	t.Parallel()
	srv := listen(t, "tcp")
	s, err := NewStatsd(srv.addr, "tcp", Options{Flush: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var opened, open atomic.Uint64
	s.RedisPool(opened.Load, open.Load)
	for i, tc := range []struct {
		opened, open uint64
		want         []string
		notSent      string
	}{
		{3, 2, []string{"ratelimit.redis_pool.cx_active:2|g", "ratelimit.redis_pool.cx_total:3|c", "ratelimit.redis_pool.cx_local_close:1|c"}, ""},
		{5, 4, []string{"ratelimit.redis_pool.cx_active:4|g", "ratelimit.redis_pool.cx_total:2|c"}, "cx_local_close"},
		// More open than opened, read a moment apart: as many as opened.
		{5, 6, []string{"ratelimit.redis_pool.cx_active:5|g"}, "cx_total"},
		{7, 1, []string{"ratelimit.redis_pool.cx_active:1|g", "ratelimit.redis_pool.cx_total:2|c", "ratelimit.redis_pool.cx_local_close:5|c"}, ""},
	} {
		opened.Store(tc.opened)
		open.Store(tc.open)
		s.Flush()
		for _, line := range srv.waitFor(t, tc.want...) {
			if tc.notSent != "" && strings.Contains(line, tc.notSent) {
				t.Errorf("flush %d: %q sent, unchanged", i+1, line)
			}
		}
	}
}
