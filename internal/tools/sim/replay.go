package sim

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/memorystore"
)

// maxHeld bounds the requests of one second held to be spread over it
// (see replayer): past it, the rest of that second's requests are decided
// at its last microsecond.
const maxHeld = 1 << 20

// replay reads the first lines lines of the log again and decides each
// request of the clients counted under every limit, each limit on a
// memorystore of its own under the log's clock; it returns how many
// requests of each client each limit denied.
func (t *tally) replay(ctx context.Context, open func() (io.ReadCloser, error), f logFormat, lines int64, limits []tollgate.Limit) ([][]int64, error) {
	rc, err := open()
	if err != nil {
		return nil, fmt.Errorf("sim: tune: %w", err)
	}
	defer rc.Close()
	r := newReplayer(t, limits)
	s := logScan{lines: newLineReader(rc), f: &f, p: lineParser{f: f}, limit: lines}
	for n := 0; ; n++ {
		client, us, err := s.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("sim: tune: %w", err)
		}
		if n%(1<<16) == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		i, ok := t.index[string(client)]
		if !ok {
			continue // beyond MaxClients
		}
		if err := r.request(ctx, i, us); err != nil {
			return nil, err
		}
	}
	if err := r.flush(ctx); err != nil {
		return nil, err
	}
	if s.lines.n < lines {
		return nil, fmt.Errorf("sim: tune: the log has %d lines now, %d when first read: did it change?", s.lines.n, lines)
	}
	for j, st := range r.stores {
		if e := st.Stats().Evictions; e > 0 {
			return nil, fmt.Errorf("sim: tune: %s: %d clients' states were evicted", limits[j].Algorithm, e)
		}
	}
	return r.denied, nil
}

// replayer decides the requests of a replay. When the log's times are
// whole seconds (nginx's are), a second's requests are held until the
// second is over and then decided spread evenly over it, each client's
// k-th of n at (k + ½)/n of the second, in time order: the log says only
// which second a request came in, and deciding them all at its start would
// make each second a burst, which the window algorithms would punish for
// what the traffic never did.
type replayer struct {
	t      *tally
	limits []tollgate.Limit
	stores []*memorystore.Store
	denied [][]int64
	now    time.Time

	spread bool
	sec    int64   // the second held
	held   []int32 // the clients of its requests, in line order
	over   bool    // maxHeld were held: the rest come at its last µs
	n, k   []int32 // by client: its requests held, and spread so far
	order  []spreadRequest
}

type spreadRequest struct {
	us     int64
	client int32
}

func newReplayer(t *tally, limits []tollgate.Limit) *replayer {
	r := &replayer{t: t, limits: limits, stores: make([]*memorystore.Store, len(limits)), denied: make([][]int64, len(limits)),
		spread: t.wholeSeconds}
	clock := func() time.Time { return r.now }
	for j := range limits {
		// One shard, bounded by the clients: no live key is ever evicted.
		r.stores[j] = memorystore.New(memorystore.WithClock(clock), memorystore.WithShards(1), memorystore.WithMaxKeys(len(t.clients)+1))
		r.denied[j] = make([]int64, len(t.clients))
	}
	if r.spread {
		r.n, r.k = make([]int32, len(t.clients)), make([]int32, len(t.clients))
	}
	return r
}

// request takes the request of client i at us.
func (r *replayer) request(ctx context.Context, i int32, us int64) error {
	if !r.spread {
		return r.decide(ctx, i, us)
	}
	if sec := floorDiv(us, 1_000_000); sec != r.sec || (len(r.held) == 0 && !r.over) {
		if err := r.flush(ctx); err != nil {
			return err
		}
		r.sec, r.over = sec, false
	}
	if r.over {
		return r.decide(ctx, i, r.sec*1_000_000+999_999)
	}
	r.held = append(r.held, i)
	r.n[i]++
	if len(r.held) == maxHeld {
		r.over = true
		return r.flush(ctx)
	}
	return nil
}

// flush decides the requests held, spread over their second.
func (r *replayer) flush(ctx context.Context) error {
	if len(r.held) == 0 {
		return nil
	}
	r.order = r.order[:0]
	for _, c := range r.held {
		k, n := int64(r.k[c]), int64(r.n[c])
		r.k[c]++
		r.order = append(r.order, spreadRequest{us: r.sec*1_000_000 + (2*k+1)*1_000_000/(2*n), client: c})
	}
	slices.SortStableFunc(r.order, func(a, b spreadRequest) int { return cmp.Compare(a.us, b.us) })
	for _, q := range r.order {
		if err := r.decide(ctx, q.client, q.us); err != nil {
			return err
		}
	}
	for _, c := range r.held {
		r.n[c], r.k[c] = 0, 0
	}
	r.held = r.held[:0]
	return nil
}

// decide decides one request of client i at us under every limit.
func (r *replayer) decide(ctx context.Context, i int32, us int64) error {
	r.now = time.UnixMicro(us)
	name := r.t.clients[i].name
	for j, l := range r.limits {
		res, err := r.stores[j].AllowN(ctx, name, l, 1)
		if err != nil {
			return fmt.Errorf("sim: tune: %s: %w", l.Algorithm, err)
		}
		if !res.Allowed {
			r.denied[j][i]++
		}
	}
	return nil
}

// logScan reads the requests of one pass over a log.
type logScan struct {
	lines *lineReader
	o     LogOptions
	f     *logFormat // nil until the first line that is not blank
	p     lineParser
	limit int64 // the lines to read; 0: all

	latest, latestLine int64 // the latest time so far (µs), and its line
	bad, late          int64
	badFirst           []BadLine
}

// next returns the next request's client and time (µs since the Unix
// epoch), or io.EOF.
func (s *logScan) next() ([]byte, int64, error) {
	for {
		if s.limit > 0 && s.lines.n >= s.limit {
			return nil, 0, io.EOF
		}
		line, long, err := s.lines.next()
		if err != nil {
			return nil, 0, err
		}
		n := s.lines.n
		if long {
			s.badLine(n, fmt.Sprintf("longer than %d bytes", MaxLineBytes))
			continue
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if s.f == nil {
			f, err := newLogFormat(s.o, line, n)
			if err != nil {
				return nil, 0, err
			}
			s.f, s.p = &f, lineParser{f: f}
		}
		if n == s.f.headerLine || (s.f.name == "csv" && line[0] == '#') {
			continue
		}
		client, us, err := s.p.parse(line)
		if err != nil {
			s.badLine(n, err.Error())
			continue
		}
		switch {
		case s.latestLine == 0 || us >= s.latest:
			s.latest, s.latestLine = us, n
		case us < s.latest-MaxLate.Microseconds():
			s.badLine(n, fmt.Sprintf("%v before line %d: more than %v earlier; is the log in time order?",
				time.Duration(s.latest-us)*time.Microsecond, s.latestLine, short(MaxLate)))
			continue
		default:
			s.late++
			us = s.latest
		}
		return client, us, nil
	}
}

func (s *logScan) badLine(n int64, reason string) {
	s.bad++
	if len(s.badFirst) < badShown {
		s.badFirst = append(s.badFirst, BadLine{Line: n, Reason: reason})
	}
}
