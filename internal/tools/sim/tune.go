package sim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
)

// Tune recommends one limit for every client of an access log, by the
// rule of Recommend applied to the clients together:
//
//   - each client's requests per second are counted in every second it
//     sent any (idle seconds would pull a client that comes once an hour
//     to 0, and a limit only ever meets a client while it sends), and its
//     p95 and p99 taken over those seconds (nearest rank);
//   - the rate is just above the sustained p99 of the clients: P, the p99
//     of their p99s (so at most 1% of clients are above it), + 10%,
//     rounded up;
//   - the burst is the smallest of 5 to 10 seconds of P that, replayed
//     through a token bucket per client on memorystore, leaves at least
//     99% of the clients never limited; when even 10 seconds does not, it
//     says so (Met is false): raise the rate;
//   - the impact: the log replayed again through each of the six
//     algorithms under that rate (and burst, for the bucket algorithms; the
//     leaky bucket polices, so it decides as the token bucket does), the
//     clients it would have limited at least once and the requests it would
//     have limited.
//
// open opens the log; Tune reads it three times (counting, choosing the
// burst, measuring the impact), so it must give the same lines each time:
// the later passes read only as many lines as the first did, so a log
// still being written may grow meanwhile. Memory follows the clients, not
// the lines: per client its name, about 100 bytes and 8 bytes for each
// distinct count of requests in a second it showed (at most √(2n) of them
// for n requests, a few dozen in practice), and during a replay each
// algorithm's state for the clients seen in its last period or so. At most
// MaxClients clients are told apart; the requests of clients first seen
// later are counted (Beyond) and left out.
func Tune(ctx context.Context, open func() (io.ReadCloser, error), o LogOptions) (*Tuning, error) {
	switch {
	case o.MaxClients == 0:
		o.MaxClients = DefaultMaxClients
	case o.MaxClients < 0 || o.MaxClients > MaxClientsLimit:
		return nil, fmt.Errorf("sim: tune: at most %d clients can be told apart, and at least 1; %d asked", MaxClientsLimit, o.MaxClients)
	}
	t, f, lines, err := count(ctx, open, o)
	if err != nil {
		return nil, err
	}
	if len(t.clients) == 0 {
		return nil, noRequests(t.tuning)
	}
	tu := t.summarize()
	p := tu.P99.P99
	rate := rateAbove(p)
	var trials []tollgate.Limit
	for s := minBurstS; s <= maxBurstS; s++ {
		trials = append(trials, tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: rate, Period: time.Second, Burst: max(1, s*p)})
	}
	denied, err := t.replay(ctx, open, f, lines, trials)
	if err != nil {
		return nil, err
	}
	chosen := len(trials) - 1
	for i, l := range trials {
		n := limitedClients(denied[i])
		tu.Bursts = append(tu.Bursts, BurstTrial{Seconds: minBurstS + i, Burst: l.Burst, ClientsLimited: n})
		if !tu.Met && 100*(len(t.clients)-n) >= clientsTarget*len(t.clients) {
			chosen, tu.Met = i, true
		}
	}
	tu.Limit, tu.BurstSeconds = trials[chosen], minBurstS+chosen
	if err := t.impact(ctx, open, f, lines, tu); err != nil {
		return nil, err
	}
	return tu, nil
}

// The bounds of Tune's clients, and its target.
const (
	// DefaultMaxClients is how many clients Tune tells apart by default.
	DefaultMaxClients = 100_000
	// MaxClientsLimit is the most it tells apart.
	MaxClientsLimit = 1_000_000
	// clientsTarget is the percentage of clients the burst must leave
	// never limited.
	clientsTarget = 99
)

// Tuning is what Tune found in an access log and recommends for it.
type Tuning struct {
	// Format is the log's: nginx, json or csv.
	Format string
	// Lines counts the lines read; Requests, the requests analysed.
	Lines, Requests int64
	// Bad counts the lines that were not requests; BadFirst holds the
	// first few.
	Bad      int64
	BadFirst []BadLine
	// Late counts requests up to MaxLate earlier than an earlier line,
	// read as if at that line's time.
	Late int64
	// MaxClients is the bound on clients; Beyond counts the requests of
	// clients first seen past it, which are not analysed.
	MaxClients int
	Beyond     int64
	// Start and End are the first and the last request's times.
	Start, End time.Time
	// WholeSeconds says every time was a whole second (nginx's are), so
	// the replays spread each second's requests evenly over it.
	WholeSeconds bool
	// Clients has one entry per client, ordered by P99, then P95.
	Clients []ClientRate
	// P95 and P99 spread the clients' p95s and their p99s.
	P95, P99 Spread
	// Limit is the recommended token bucket, of BurstSeconds of P99.P99;
	// Met says it leaves at least 99% of the clients never limited.
	Limit        tollgate.Limit
	BurstSeconds int
	Met          bool
	// Bursts are the bursts tried, 5 to 10 seconds of P99.P99.
	Bursts []BurstTrial
	// Impact has one entry per algorithm, in tollgate.Algorithms order.
	Impact []Impact
}

// ClientRate is one client's requests per second, over the seconds it
// sent any.
type ClientRate struct {
	Name          string
	Requests      int64
	P95, P99, Max int
	// Limited says the recommended limit would have limited it at least
	// once.
	Limited bool
}

// Spread is how a figure of the clients spreads across them: the
// percentiles of its values, by nearest rank.
type Spread struct{ P50, P95, P99, Max int }

// BurstTrial is one burst tried: how many clients it would have limited.
type BurstTrial struct{ Seconds, Burst, ClientsLimited int }

// Impact is what the recommended rate would have done with one algorithm:
// the clients limited at least once, and the requests limited. Skipped
// says why an algorithm did not run (a sliding window log above
// tollgate.MaxLogRate).
type Impact struct {
	Limit           tollgate.Limit
	ClientsLimited  int
	RequestsLimited int64
	Skipped         string
}

// clientStats is what the first pass keeps of a client.
type clientStats struct {
	name     string
	requests int64
	sec      int64      // the second being counted, since the Unix epoch
	n        int        // its requests so far
	busy     int64      // seconds with requests, but the one being counted
	counts   []secCount // by n: how many seconds held n requests
}

type secCount struct{ n, seconds uint32 }

// addSecond records a second in which c sent n requests.
func (c *clientStats) addSecond(n int) {
	n = int(min(int64(n), 1<<32-1))
	c.busy++
	i, found := slices.BinarySearchFunc(c.counts, uint32(n), func(e secCount, n uint32) int { return cmp.Compare(e.n, n) })
	if found {
		c.counts[i].seconds++
		return
	}
	c.counts = slices.Insert(c.counts, i, secCount{n: uint32(n), seconds: 1})
}

// quantile returns the pct-th percentile of c's seconds, by nearest rank.
func (c *clientStats) quantile(pct int64) int {
	rank, seen := max(1, (pct*c.busy+99)/100), int64(0)
	for _, e := range c.counts {
		if seen += int64(e.seconds); seen >= rank {
			return int(e.n)
		}
	}
	return 0
}

// tally is the first pass's count.
type tally struct {
	tuning
	max     int
	index   map[string]int32
	clients []clientStats
}

// tuning is what every pass reads of the log as a whole.
type tuning struct {
	lines, requests, bad, late, beyond int64
	badFirst                           []BadLine
	first, last                        int64 // µs
	format                             string
	// wholeSeconds says every time was a whole second (nginx's are):
	// replays spread each second's requests over it.
	wholeSeconds bool
}

func (t *tally) add(client []byte, us int64) {
	i, ok := t.index[string(client)]
	if !ok {
		if len(t.clients) >= t.max {
			t.beyond++
			return
		}
		i = int32(len(t.clients))
		name := string(client)
		t.index[name] = i
		t.clients = append(t.clients, clientStats{name: name})
	}
	if t.requests == 0 {
		t.first, t.wholeSeconds = us, true
	}
	t.wholeSeconds = t.wholeSeconds && us%1_000_000 == 0
	t.requests++
	t.last = us
	c := &t.clients[i]
	c.requests++
	sec := floorDiv(us, 1_000_000)
	if c.n > 0 && sec != c.sec {
		c.addSecond(c.n)
		c.n = 0
	}
	c.sec = sec
	c.n++
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// count is the first pass: every client's seconds. It returns the log's
// format and how many lines it read, for the later passes.
func count(ctx context.Context, open func() (io.ReadCloser, error), o LogOptions) (*tally, logFormat, int64, error) {
	rc, err := open()
	if err != nil {
		return nil, logFormat{}, 0, fmt.Errorf("sim: tune: %w", err)
	}
	defer rc.Close()
	t := &tally{max: o.MaxClients, index: map[string]int32{}}
	s := logScan{lines: newLineReader(rc), o: o}
	for {
		client, us, err := s.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, logFormat{}, 0, fmt.Errorf("sim: tune: %w", err)
		}
		t.add(client, us)
		if t.requests%(1<<16) == 0 && ctx.Err() != nil {
			return nil, logFormat{}, 0, ctx.Err()
		}
	}
	for i := range t.clients {
		if c := &t.clients[i]; c.n > 0 {
			c.addSecond(c.n)
		}
	}
	t.lines, t.bad, t.badFirst, t.late = s.lines.n, s.bad, s.badFirst, s.late
	if s.f != nil {
		t.format = s.f.name
		return t, *s.f, s.lines.n, nil
	}
	return t, logFormat{}, s.lines.n, nil
}

// noRequests is the error of a log without a request in it.
func noRequests(t tuning) error {
	msg := fmt.Sprintf("sim: tune: no request in %d lines", t.lines)
	if t.bad > 0 {
		msg += fmt.Sprintf(" (%d bad; line %d: %s)", t.bad, t.badFirst[0].Line, t.badFirst[0].Reason)
	}
	return errors.New(msg)
}

// summarize returns the Tuning of the first pass: the clients' rates and
// their spread.
func (t *tally) summarize() *Tuning {
	tu := &Tuning{Format: t.format, Lines: t.lines, Requests: t.requests, Bad: t.bad, BadFirst: t.badFirst,
		Late: t.late, MaxClients: t.max, Beyond: t.beyond, WholeSeconds: t.wholeSeconds,
		Start: time.UnixMicro(t.first).UTC(), End: time.UnixMicro(t.last).UTC()}
	p95s, p99s := make([]int, len(t.clients)), make([]int, len(t.clients))
	tu.Clients = make([]ClientRate, len(t.clients))
	for i := range t.clients {
		c := &t.clients[i]
		r := ClientRate{Name: c.name, Requests: c.requests, P95: c.quantile(95), P99: c.quantile(99), Max: int(c.counts[len(c.counts)-1].n)}
		tu.Clients[i], p95s[i], p99s[i] = r, r.P95, r.P99
	}
	tu.P95, tu.P99 = spread(p95s), spread(p99s)
	return tu
}

// spread sorts v and returns its percentiles.
func spread(v []int) Spread {
	slices.Sort(v)
	q := func(pct int) int { return v[max(1, (pct*len(v)+99)/100)-1] }
	return Spread{P50: q(50), P95: q(95), P99: q(99), Max: v[len(v)-1]}
}

func limitedClients(denied []int64) int {
	n := 0
	for _, d := range denied {
		if d > 0 {
			n++
		}
	}
	return n
}

// impact replays the log through the six algorithms under tu.Limit's
// rate, and fills in tu.Impact and each client's Limited (by the token
// bucket); then it orders tu.Clients.
func (t *tally) impact(ctx context.Context, open func() (io.ReadCloser, error), f logFormat, lines int64, tu *Tuning) error {
	var limits []tollgate.Limit
	for _, a := range tollgate.Algorithms() {
		l := tollgate.Limit{Algorithm: a, Rate: tu.Limit.Rate, Period: time.Second}
		switch a {
		case tollgate.TokenBucket, tollgate.GCRA, tollgate.LeakyBucket:
			l.Burst = tu.Limit.Burst
		}
		if err := l.Validate(); err != nil {
			tu.Impact = append(tu.Impact, Impact{Limit: l, Skipped: limitError(err)})
			continue
		}
		tu.Impact = append(tu.Impact, Impact{Limit: l})
		limits = append(limits, l)
	}
	denied, err := t.replay(ctx, open, f, lines, limits)
	if err != nil {
		return err
	}
	j := 0
	for i := range tu.Impact {
		im := &tu.Impact[i]
		if im.Skipped != "" {
			continue
		}
		im.ClientsLimited = limitedClients(denied[j])
		for c, d := range denied[j] {
			im.RequestsLimited += d
			if im.Limit.Algorithm == tollgate.TokenBucket && d > 0 {
				tu.Clients[c].Limited = true
			}
		}
		j++
	}
	slices.SortStableFunc(tu.Clients, func(a, b ClientRate) int { return cmp.Or(cmp.Compare(a.P99, b.P99), cmp.Compare(a.P95, b.P95)) })
	return nil
}

// limitError is err without the package names before "invalid limit".
func limitError(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "invalid limit: "); i >= 0 {
		return msg[i+len("invalid limit: "):]
	}
	return msg
}
