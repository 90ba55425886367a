package sim

import (
	"bytes"
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
)

// genClient is a client of a generated log: perSecond requests in every
// second, and in the seconds of bursts as many as bursts says instead.
type genClient struct {
	name      string
	perSecond int
	bursts    map[int]int
}

func (c genClient) in(second int) int {
	if n, ok := c.bursts[second]; ok {
		return n
	}
	return c.perSecond
}

var genStart = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// genLog writes seconds seconds of the clients' requests in format, from
// genStart: a client's n requests of a second at (k + ½)/n of it (nginx
// keeps only the second), the lines in time order.
func genLog(w io.Writer, format string, seconds int, clients []genClient) {
	bw := bytes.Buffer{}
	if format == "csv" {
		bw.WriteString("time,client,status\n")
	}
	type event struct {
		us     int64
		client int
	}
	var events []event
	for s := range seconds {
		events = events[:0]
		for i, c := range clients {
			n := c.in(s)
			for k := range n {
				events = append(events, event{int64(2*k+1) * 1_000_000 / int64(2*n), i})
			}
		}
		slices.SortStableFunc(events, func(a, b event) int { return int(a.us - b.us) })
		at := genStart.Add(time.Duration(s) * time.Second)
		for _, e := range events {
			name := clients[e.client].name
			sec, us := at.Unix(), e.us
			switch format {
			case "nginx":
				fmt.Fprintf(&bw, "%s - - [%s] \"GET /api/items?page=2 HTTP/1.1\" 200 1234 \"-\" \"client/1.0\"\n", name, at.Format("02/Jan/2006:15:04:05 -0700"))
			case "json":
				fmt.Fprintf(&bw, "{\"level\":\"info\",\"ts\":%d.%06d,\"request\":{\"client_ip\":%q,\"uri\":\"/api\"},\"status\":200}\n", sec, us, name)
			case "csv":
				fmt.Fprintf(&bw, "%d.%06d,%s,200\n", sec, us, name)
			}
			if bw.Len() > 1<<20 {
				w.Write(bw.Bytes())
				bw.Reset()
			}
		}
	}
	w.Write(bw.Bytes())
}

// opener opens data, as Tune opens a file.
func opener(data []byte) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
}

func tune(t *testing.T, data []byte, o LogOptions) *Tuning {
	t.Helper()
	tu, err := Tune(context.Background(), opener(data), o)
	if err != nil {
		t.Fatal(err)
	}
	return tu
}

// impactOf returns tu's impact for algorithm a.
func impactOf(t *testing.T, tu *Tuning, a tollgate.Algorithm) Impact {
	t.Helper()
	for _, im := range tu.Impact {
		if im.Limit.Algorithm == a {
			return im
		}
	}
	t.Fatalf("no impact for %s", a)
	return Impact{}
}

// TestTuneKnownRates: 99 clients at 1 to 99 requests a second and one at
// 500, for a minute, as JSON lines with µs times. Every figure follows
// from those rates.
func TestTuneKnownRates(t *testing.T) {
	t.Parallel()
	const seconds, heavy = 60, 500
	var clients []genClient
	for k := 1; k <= 99; k++ {
		clients = append(clients, genClient{name: fmt.Sprintf("10.0.0.%d", k), perSecond: k})
	}
	clients = append(clients, genClient{name: "192.0.2.1", perSecond: heavy})
	var log bytes.Buffer
	genLog(&log, "json", seconds, clients)
	tu := tune(t, log.Bytes(), LogOptions{Client: "request.client_ip", Time: "ts"})

	requests := int64(seconds * (99*100/2 + heavy))
	if tu.Format != "json" || tu.Requests != requests || tu.Lines != requests || tu.Bad != 0 || tu.Late != 0 || len(tu.Clients) != 100 || tu.WholeSeconds {
		t.Fatalf("format %s, %d requests in %d lines, %d bad, %d late, %d clients, whole seconds %v; want json, %d, 100 clients",
			tu.Format, tu.Requests, tu.Lines, tu.Bad, tu.Late, len(tu.Clients), tu.WholeSeconds, requests)
	}
	// A steady client's every second holds its rate: p95 = p99 = max.
	for i, c := range tu.Clients {
		want := min(i+1, 99)
		if i == 99 {
			want = heavy
		}
		if c.P95 != want || c.P99 != want || c.Max != want {
			t.Errorf("client %d (%s): p95 %d, p99 %d, max %d; want %d", i, c.Name, c.P95, c.P99, c.Max, want)
		}
	}
	// Across 100 clients, by nearest rank: the 50th, 95th and 99th rates.
	if want := (Spread{P50: 50, P95: 95, P99: 99, Max: heavy}); tu.P99 != want || tu.P95 != want {
		t.Errorf("spread of p99s %+v, of p95s %+v; want %+v", tu.P99, tu.P95, want)
	}
	// 99 + 10% = 108.9: 109 a second; the heavy client alone is over it,
	// 1% of the clients, so 5 s of 99 (495) already leaves 99% unlimited.
	rate, burst := 109, 5*99
	if want := (tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: rate, Period: time.Second, Burst: burst}); tu.Limit != want || tu.BurstSeconds != 5 || !tu.Met {
		t.Errorf("recommended %v (%d s, met %v), want %v (5 s, met)", tu.Limit, tu.BurstSeconds, tu.Met, want)
	}
	for _, b := range tu.Bursts {
		if b.ClientsLimited != 1 || b.Burst != b.Seconds*99 {
			t.Errorf("burst of %d s: %+v, want %d tokens and the one heavy client limited", b.Seconds, b, b.Seconds*99)
		}
	}
	// The heavy client sends 500 a second, evenly. A window of 109 a
	// second admits 109 of each second's 500, and so does an exact log
	// (each admitted request leaves it a second later, as the next
	// second's first arrives).
	windowDenied := int64((heavy - rate) * seconds)
	// A bucket admits its burst, then what refills from the first arrival
	// (at 1 ms) to the last (at 59.999 s).
	bucketDenied := float64(heavy*seconds) - (float64(burst) + float64(rate)*59.998)
	for _, im := range tu.Impact {
		if im.ClientsLimited != 1 || im.Skipped != "" {
			t.Errorf("%s: %d clients limited (%s), want the heavy one", im.Limit.Algorithm, im.ClientsLimited, im.Skipped)
		}
		got := im.RequestsLimited
		switch a := im.Limit.Algorithm; a {
		case tollgate.FixedWindow, tollgate.SlidingWindowLog:
			if got != windowDenied {
				t.Errorf("%s limited %d requests, want %d", a, got, windowDenied)
			}
		case tollgate.SlidingWindowCounter:
			// Strict under sustained overload: up to 2% fewer admitted
			// than the exact log's 109 a second.
			if lo, hi := windowDenied, windowDenied+int64(0.02*float64(rate*seconds)); got < lo || got > hi {
				t.Errorf("%s limited %d requests, want %d to %d", a, got, lo, hi)
			}
		default: // the token bucket, GCRA, the leaky bucket policing
			if d := float64(got) - bucketDenied; d < -2 || d > 2 {
				t.Errorf("%s limited %d requests, want %.1f ± 2", a, got, bucketDenied)
			}
		}
	}
	if !tu.Clients[99].Limited || slices.ContainsFunc(tu.Clients[:99], func(c ClientRate) bool { return c.Limited }) {
		t.Errorf("only the heavy client should be marked limited")
	}
}

// TestTuneBurstChoice: 100 clients at 10 a second for 10 minutes, three of
// them with one second of 75, in nginx's format (whole seconds, spread
// over each second by the replay). Those seconds need more tokens than 6 s
// of p99 and fewer than 7 s: the burst is the smallest that spares 99%.
func TestTuneBurstChoice(t *testing.T) {
	t.Parallel()
	var clients []genClient
	for i := range 100 {
		c := genClient{name: fmt.Sprintf("10.1.0.%d", i), perSecond: 10}
		if i < 3 {
			c.bursts = map[int]int{100 * (i + 1): 75}
		}
		clients = append(clients, c)
	}
	var log bytes.Buffer
	genLog(&log, "nginx", 600, clients)
	tu := tune(t, log.Bytes(), LogOptions{})
	if tu.Format != "nginx" || !tu.WholeSeconds || len(tu.Clients) != 100 {
		t.Fatalf("format %s, whole seconds %v, %d clients", tu.Format, tu.WholeSeconds, len(tu.Clients))
	}
	// One second of 75 among 600 is above the 594th: every p99 is 10.
	if tu.P99.P99 != 10 || tu.P99.Max != 10 || tu.Limit.Rate != 11 {
		t.Fatalf("p99s %+v, rate %d; want 10 and 11", tu.P99, tu.Limit.Rate)
	}
	// A second of 75 requests, evenly spread, with 11 tokens a second
	// coming in: the k-th (from 0) needs the bucket to have held about
	// 1.38 + 0.853 k tokens, 64.5 for the last. 60 (6 s) is short from
	// the 70th on; 70 (7 s) is enough. Three of 100 clients limited is
	// more than 1%.
	var got []int
	for _, b := range tu.Bursts {
		got = append(got, b.ClientsLimited)
	}
	if want := []int{3, 3, 0, 0, 0, 0}; !slices.Equal(got, want) {
		t.Errorf("clients limited by 5 to 10 s of burst: %v, want %v", got, want)
	}
	if tu.BurstSeconds != 7 || tu.Limit.Burst != 70 || !tu.Met {
		t.Errorf("burst %d (%d s, met %v), want 70 (7 s)", tu.Limit.Burst, tu.BurstSeconds, tu.Met)
	}
	for _, a := range []tollgate.Algorithm{tollgate.TokenBucket, tollgate.GCRA, tollgate.LeakyBucket} {
		if im := impactOf(t, tu, a); im.ClientsLimited != 0 || im.RequestsLimited != 0 {
			t.Errorf("%s: %+v, want nothing limited with the recommended burst", a, im)
		}
	}
	// The windows have no burst: 11 of the 75 pass, and the steady
	// clients are never over.
	if im := impactOf(t, tu, tollgate.FixedWindow); im.ClientsLimited != 3 || im.RequestsLimited != 3*(75-11) {
		t.Errorf("fixed_window: %+v, want 3 clients and %d requests", im, 3*(75-11))
	}
	for _, a := range []tollgate.Algorithm{tollgate.SlidingWindowLog, tollgate.SlidingWindowCounter} {
		if im := impactOf(t, tu, a); im.ClientsLimited != 3 || im.RequestsLimited < 3*(75-11) {
			t.Errorf("%s: %+v, want the 3 bursting clients and at least %d requests", a, im, 3*(75-11))
		}
	}
}

// TestTuneNotMet: when even 10 s of burst limits more than 1% of the
// clients, the recommendation says so and what to do.
func TestTuneNotMet(t *testing.T) {
	t.Parallel()
	var clients []genClient
	for i := range 100 {
		c := genClient{name: fmt.Sprintf("c%d", i), perSecond: 1}
		if i < 5 { // 10 s at 50 a second: 5% of the clients, 0.5% of their seconds
			c.bursts = map[int]int{}
			for s := 1000; s < 1010; s++ {
				c.bursts[s] = 50
			}
		}
		clients = append(clients, c)
	}
	var log bytes.Buffer
	genLog(&log, "csv", 2000, clients)
	tu := tune(t, log.Bytes(), LogOptions{})
	if tu.Met || tu.BurstSeconds != 10 || tu.Limit.Rate != 2 || tu.Bursts[5].ClientsLimited != 5 {
		t.Errorf("met %v at %d s, rate %d, bursts %+v; want not met at 10 s, rate 2, 5 clients limited", tu.Met, tu.BurstSeconds, tu.Limit.Rate, tu.Bursts)
	}
	var out bytes.Buffer
	if err := tu.Write(&out); err != nil || !strings.Contains(out.String(), "only 95.00% of the clients never limited") || !strings.Contains(out.String(), "raise the rate") {
		t.Errorf("Write: %v\n%s", err, out.String())
	}
}

// TestTuneFormats: one traffic written in each format gives one tuning.
func TestTuneFormats(t *testing.T) {
	t.Parallel()
	var clients []genClient
	for i := range 30 {
		clients = append(clients, genClient{name: fmt.Sprintf("10.2.0.%d", i), perSecond: 1 + i%7, bursts: map[int]int{i: 40}})
	}
	logs := map[string][]byte{}
	for _, f := range []string{"nginx", "json", "csv"} {
		var b bytes.Buffer
		genLog(&b, f, 120, clients)
		logs[f] = b.Bytes()
	}
	// The same CSV without its header, the columns by number.
	noHeader := logs["csv"][bytes.IndexByte(logs["csv"], '\n')+1:]
	tests := []struct {
		name string
		data []byte
		o    LogOptions
	}{
		{"nginx", logs["nginx"], LogOptions{}},
		{"nginx, said", logs["nginx"], LogOptions{Format: "nginx", Client: "remote_addr"}},
		{"json, nested field", logs["json"], LogOptions{Client: "request.client_ip", Time: "ts"}},
		{"csv, header", logs["csv"], LogOptions{}},
		{"csv, columns by number", noHeader, LogOptions{Format: "csv", Client: "2", Time: "1"}},
	}
	var first *Tuning
	for _, tc := range tests {
		tu := tune(t, tc.data, tc.o)
		if tu.Requests != int64(len(bytes.Split(bytes.TrimSpace(logs["nginx"]), []byte("\n")))) || tu.Bad != 0 {
			t.Errorf("%s: %d requests, %d bad", tc.name, tu.Requests, tu.Bad)
		}
		if first == nil {
			first = tu
			continue
		}
		if !slices.Equal(tu.Clients, first.Clients) || tu.P99 != first.P99 || tu.Limit != first.Limit || !slices.Equal(tu.Impact, first.Impact) {
			t.Errorf("%s: %v %+v %+v\ndiffers from nginx's: %v %+v %+v", tc.name, tu.Limit, tu.P99, tu.Impact, first.Limit, first.P99, first.Impact)
		}
	}
}

// TestTuneBadLines: lines that are not requests are counted, the first
// five kept with their numbers and reasons, and skipped; the rest of the
// log is read as if they were not there.
func TestTuneBadLines(t *testing.T) {
	t.Parallel()
	line := func(addr string, sec int) string {
		return fmt.Sprintf(`%s - - [%s] "GET / HTTP/1.1" 200 5 "-" "x"`, addr, genStart.Add(time.Duration(sec)*time.Second).Format("02/Jan/2006:15:04:05 -0700"))
	}
	lines := []string{
		line("10.0.0.1", 100), // 1
		"garbage",             // 2: not nginx's
		"",                    // 3: blank, skipped
		line("10.0.0.2", 101), // 4
		`10.0.0.3 - - [31/Foo/2026:12:00:00 +0000] "GET / HTTP/1.1" 200 5 "-" "x"`, // 5: bad time
		line(strings.Repeat("a", MaxClientBytes+1), 101),                           // 6: client too long
		line("10.0.0.1", 102) + strings.Repeat("x", MaxLineBytes),                  // 7: a line too long
		line("10.0.0.2", 30),  // 8: 71 s before line 4's time
		line("10.0.0.1", 90),  // 9: 11 s early: counted at 101 s
		line("10.0.0.2", 103), // 10
		`10.0.0.4 - - [01/Mar/2026:12:01:44 +0000] "GET / HTTP/1.1" 2000 5`, // 11: not a status
		line("10.0.0.1", 104), // 12
	}
	tu := tune(t, []byte(strings.Join(lines, "\r\n")), LogOptions{})
	if tu.Lines != 12 || tu.Requests != 5 || tu.Bad != 6 || tu.Late != 1 {
		t.Errorf("%d lines, %d requests, %d bad, %d late; want 12, 5, 6, 1", tu.Lines, tu.Requests, tu.Bad, tu.Late)
	}
	want := []BadLine{
		{2, errNginx.Error()},
		{5, errNginxTime.Error()},
		{6, errLongName.Error()},
		{7, fmt.Sprintf("longer than %d bytes", MaxLineBytes)},
		{8, "1m11s before line 4: more than 1m earlier; is the log in time order?"},
	}
	if !slices.Equal(tu.BadFirst, want) {
		t.Errorf("bad lines %+v\nwant %+v", tu.BadFirst, want)
	}
	var out bytes.Buffer
	if err := tu.Write(&out); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"; 6 bad lines.", "  line 2: not nginx's", "  (the first 5 of 6 bad lines)", "1 request came up to 1m before"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("Write does not say %q:\n%s", s, out.String())
		}
	}
}

// TestTuneBadLinesOfEachFormat: each format's own bad lines.
func TestTuneBadLinesOfEachFormat(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, log string
		o         LogOptions
		want      []string // the reasons, in order
	}{
		{"json", `{"client":"a","time":1772366400}
{"client":"a","time":1772366400
{"time":1772366400}
{"client":{"ip":"a"},"time":1772366400}
{"client":"a","time":"yesterday"}
["client","a"]
{"client":"\u0061b","time":"2026-03-01T12:00:01Z"}`, LogOptions{}, []string{
			"not a JSON object", "no field client", "field client is an object, not a string or a number", errBadTime.Error(), "not a JSON object"}},
		{"csv", `client,time
a,1772366400
"b,1772366400
c
# a comment
"d",1772366401.5`, LogOptions{}, []string{"a quoted field without its closing quote", "fewer than 2 fields"}},
		{"nginx remote_user", `10.0.0.1 - alice [01/Mar/2026:12:00:00 +0000] "GET / HTTP/1.1" 200 5 "-" "x"
10.0.0.1 - - [01/Mar/2026:12:00:00 +0000] "GET / HTTP/1.1" 200 5 "-" "x"`, LogOptions{Client: "remote_user"}, []string{errNoUser.Error()}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tu := tune(t, []byte(tc.log), tc.o)
			var got []string
			for _, b := range tu.BadFirst {
				got = append(got, b.Reason)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("bad lines %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestTuneRefuses: logs and options Tune cannot work with give a clear
// error.
func TestTuneRefuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, log string
		o         LogOptions
		want      string
	}{
		{"only bad lines", "garbage\nmore garbage\n", LogOptions{Format: "nginx"}, "no request in 2 lines (2 bad; line 1: not nginx's"},
		{"empty", "", LogOptions{}, "no request in 0 lines"},
		{"unknown format", "x\n", LogOptions{Format: "apache"}, `unknown log format "apache"`},
		{"csv header without the columns", "a,b\n1,2\n", LogOptions{}, `has no column "client" and "time"`},
		{"nginx client", "x\n", LogOptions{Format: "nginx", Client: "host"}, "remote_addr or remote_user"},
		{"too many clients", "x\n", LogOptions{MaxClients: MaxClientsLimit + 1}, "at most 1000000 clients"},
	}
	for _, tc := range tests {
		_, err := Tune(context.Background(), opener([]byte(tc.log)), tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "sim: ") {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}

// TestTuneMaxClients: past MaxClients, new clients are counted but not
// kept, and the tuning says how much was left out.
func TestTuneMaxClients(t *testing.T) {
	t.Parallel()
	var clients []genClient
	for i := range 150 {
		clients = append(clients, genClient{name: fmt.Sprintf("10.3.0.%d", i), perSecond: 2})
	}
	var log bytes.Buffer
	genLog(&log, "nginx", 10, clients)
	tu := tune(t, log.Bytes(), LogOptions{MaxClients: 100})
	// Each second lists the clients in order: the first 100 are kept.
	if len(tu.Clients) != 100 || tu.Beyond != 50*2*10 || tu.Requests != 100*2*10 {
		t.Errorf("%d clients, %d beyond, %d requests; want 100, 1000, 2000", len(tu.Clients), tu.Beyond, tu.Requests)
	}
	var out bytes.Buffer
	if err := tu.Write(&out); err != nil || !strings.Contains(out.String(), "More than 100 clients: the 1000 requests of the clients first seen after the first 100 are not analysed") {
		t.Errorf("Write: %v\n%s", err, out.String())
	}
}

// TestTuneLogChanged: a log shorter on a later read is an error, not a
// replay of other lines.
func TestTuneLogChanged(t *testing.T) {
	t.Parallel()
	var log bytes.Buffer
	genLog(&log, "nginx", 5, []genClient{{name: "a", perSecond: 3}})
	reads := 0
	open := func() (io.ReadCloser, error) {
		reads++
		data := log.Bytes()
		if reads > 1 {
			data = data[:len(data)/2]
		}
		return io.NopCloser(bytes.NewReader(data)), nil
	}
	if _, err := Tune(context.Background(), open, LogOptions{}); err == nil || !strings.Contains(err.Error(), "did it change?") {
		t.Errorf("err = %v, want the log changed", err)
	}
}

// TestTuneMemoryFollowsClients: ten times the lines of the same clients
// allocate about as much: nothing is kept per line.
func TestTuneMemoryFollowsClients(t *testing.T) {
	clients := []genClient{{name: "10.4.0.1", perSecond: 50}, {name: "10.4.0.2", perSecond: 20}, {name: "10.4.0.3", perSecond: 30}}
	alloc := func(seconds int) uint64 {
		var log bytes.Buffer
		genLog(&log, "nginx", seconds, clients)
		var before, after runtimeMem
		before.read()
		tune(t, log.Bytes(), LogOptions{})
		after.read()
		return after.total - before.total
	}
	small, large := alloc(200), alloc(2000) // 20,000 and 200,000 lines
	if large > small+(1<<20) {
		t.Errorf("%d bytes allocated for 200,000 lines, %d for 20,000: the tuning keeps something per line", large, small)
	}
}

// runtimeMem reads how much the process has allocated so far.
type runtimeMem struct{ total uint64 }

func (m *runtimeMem) read() {
	var s runtime.MemStats
	runtime.ReadMemStats(&s)
	m.total = s.TotalAlloc
}

// TestWriteTuneSVG: the chart is well-formed SVG with the recommendation,
// and has one column per pixel for more clients than pixels.
func TestWriteTuneSVG(t *testing.T) {
	t.Parallel()
	var clients []genClient
	for i := range 1200 {
		clients = append(clients, genClient{name: fmt.Sprintf("c%d", i), perSecond: 1 + i%13})
	}
	clients[7].perSecond = 400
	var log bytes.Buffer
	genLog(&log, "csv", 20, clients)
	tu := tune(t, log.Bytes(), LogOptions{})
	var svg bytes.Buffer
	if err := WriteTuneSVG(&svg, tu, "clients <&> rates"); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(svg.Bytes()))
	for {
		if _, err := dec.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
	}
	for _, s := range []string{"clients &lt;&amp;&gt; rates", fmt.Sprintf("%d/s", tu.Limit.Rate), "1200 clients", "limited by the recommended token bucket (1)"} {
		if !strings.Contains(svg.String(), s) {
			t.Errorf("the chart lacks %q", s)
		}
	}
	if n := len(columns(tu.Clients)); n != tunePlotW {
		t.Errorf("%d columns for 1200 clients, want %d", n, tunePlotW)
	}
}

// BenchmarkTune tunes a generated nginx log of 2,000,000 lines from 2,000
// clients: the three passes, per line.
func BenchmarkTune(b *testing.B) {
	var clients []genClient
	for i := range 2000 {
		clients = append(clients, genClient{name: fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255), perSecond: 1 + i%20})
	}
	// 2000 clients at 10.5 a second on average: 21,000 lines a second.
	path := filepath.Join(b.TempDir(), "access.log")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	genLog(f, "nginx", 2_000_000/21_000+1, clients)
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	open := func() (io.ReadCloser, error) { return os.Open(path) }
	b.ReportAllocs()
	b.ResetTimer()
	var lines int64
	for range b.N {
		tu, err := Tune(context.Background(), open, LogOptions{})
		if err != nil {
			b.Fatal(err)
		}
		lines = tu.Lines
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(int64(b.N)*lines), "ns/line")
	b.ReportMetric(float64(lines), "lines")
}
