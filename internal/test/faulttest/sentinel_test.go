package faulttest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/redistest"
)

// TestSentinelMasterKilled crashes the master of a Sentinel deployment (a
// master, one replica, three sentinels with quorum 2) while 32 goroutines
// make decisions through a go-redis failover client (half of them
// pipelined). Decisions fail until
// the sentinels have promoted the replica, then resume through it; the gap
// must stay within a bound derived from the sentinels' timeouts. Half the
// calls spend from one counted key per algorithm: the promoted replica may
// have missed the last writes (replication is asynchronous), which can
// only give allowance back, never take more than was admitted.
func TestSentinelMasterKilled(t *testing.T) {
	t.Parallel()
	s := redistest.NewSentinel(t, 1)
	lims := limiters(s.Client(t), deadline)
	ctx := ctxTimeout(t, 60*time.Second)
	prefix := key(t)
	algs := tollgate.Algorithms()
	counted := func(a tollgate.Algorithm) string { return prefix + ":counted:" + a.String() }
	spreadKeys := spread(prefix)
	l := startLoad(t, lims, goroutines, func(g, i int) call {
		if i%2 == 0 {
			a := algs[(i/2)%len(algs)]
			return call{key: counted(a), limit: exactLimit(a), n: 1, count: true}
		}
		return spreadKeys(g, i)
	})
	warmUp(t, ctx, l)

	killed := time.Now()
	old, promoted, err := s.KillMaster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	switched := time.Now()
	if _, err := l.waitAllOK(ctx, switched); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	l.stop()
	sum := l.summary()
	sum.check(t)

	// A sentinel marks the master down after SentinelDownAfter without an
	// answer; the sentinels agree it is down within about a second (they
	// ask each other every second); the one that starts the failover waits
	// up to a second first (Redis spreads sentinels out so they do not all
	// start at once); promoting the replica and seeing it report itself
	// master takes another second or so of INFO polling. If that election
	// fails (split vote), the next starts after 2×SentinelFailoverTimeout.
	// The failover client asks a sentinel on every new connection, so it
	// follows within a round trip; 2 s are left for scheduling on a loaded
	// machine.
	bound := redistest.SentinelDownAfter + 3*time.Second + 2*redistest.SentinelFailoverTimeout + 2*time.Second
	if sum.errsMarked == 0 {
		t.Error("no decision failed while the master was dead")
	} else if sum.recovered.IsZero() {
		t.Error("decisions did not resume")
	} else if took := sum.recovered.Sub(killed); took > bound {
		t.Errorf("decisions resumed %v after the kill, more than %v", took, bound)
	}
	var lost []string
	for _, a := range algs {
		res, err := lims[0].Peek(ctx, counted(a), exactLimit(a))
		if err != nil {
			t.Fatal(err)
		}
		k, c := counted(a), exactLimit(a).Capacity()
		admitted, failed := sum.admitted[k], sum.failed[k]
		if res.Remaining < c-admitted-failed {
			t.Errorf("%s: Remaining %d after %d admitted and %d failed decisions: more spent than admitted", a, res.Remaining, admitted, failed)
		}
		lost = append(lost, fmt.Sprintf("%s %d of %d", a, max(0, res.Remaining-(c-admitted)), admitted))
	}
	t.Logf("killed master %s; the sentinels promoted %s %v later. %d decisions failed, the first %v after the kill; "+
		"every goroutine succeeded again %v after the kill: a gap of %v (bound %v)\n"+
		"admitted decisions forgotten by the promoted replica: %s\n%v",
		old.Addr(), promoted.Addr(), switched.Sub(killed).Round(time.Millisecond), sum.errsMarked,
		sum.firstErr.Sub(killed).Round(time.Millisecond), sum.recovered.Sub(killed).Round(time.Millisecond),
		sum.recovered.Sub(sum.firstErr).Round(time.Millisecond), bound, strings.Join(lost, ", "), sum)
}
