package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// SentinelMasterName is the name the sentinels monitor the master under,
	// the MasterName of a go-redis failover client.
	SentinelMasterName = "tollgate"

	// SentinelDownAfter is the sentinels' down-after-milliseconds: a sentinel
	// considers the master down (SDOWN) once it has not answered for this
	// long. Redis's default is 30 s; tests need failovers in seconds.
	SentinelDownAfter = time.Second

	// SentinelFailoverTimeout is the sentinels' failover-timeout. A sentinel
	// that started or voted for a failover that did not complete (a split
	// vote, a leader that died) waits twice this long before it starts
	// another, so one failed election round costs at most 2×this.
	SentinelFailoverTimeout = 2 * time.Second

	sentinels         = 3
	sentinelQuorum    = 2 // sentinels that must agree the master is down
	sentinelReadyTime = 20 * time.Second
)

// Sentinel is a Redis Sentinel deployment on 127.0.0.1: a master, its
// replicas, and three sentinels that monitor the master with a quorum of two
// and promote a replica when it fails. The timeouts are short (see
// SentinelDownAfter and SentinelFailoverTimeout), so a failover takes a few
// seconds instead of Redis's default of half a minute and more.
//
// To fail over, stop the master (KillMaster does that and waits for the
// sentinels to promote a replica); a stopped server brought back with Start
// comes up as an empty master on its old address until the sentinels turn
// it into a replica of the new master, as in production.
type Sentinel struct {
	// Nodes are the data servers. Nodes[0] was started as the master, the
	// others as its replicas. Roles change after a failover: use Master to
	// learn the current master.
	Nodes []*Server
	// Sentinels are the three sentinel processes (redis-server --sentinel).
	Sentinels []*Server

	closeOnce sync.Once
}

// StartSentinel starts a master, replicas replicas of it (at least 1) and
// three sentinels monitoring it, and waits until every replica is in sync
// and every sentinel knows the master, each replica and the two other
// sentinels: only then can the sentinels fail over. It is meant for
// TestMain; the caller must call Close. Tests should use NewSentinel.
func StartSentinel(replicas int) (*Sentinel, error) {
	if replicas < 1 {
		return nil, fmt.Errorf("redistest: start sentinel: need at least one replica to fail over to, got %d", replicas)
	}
	s := &Sentinel{Nodes: make([]*Server, 1+replicas), Sentinels: make([]*Server, sentinels)}
	fail := func(err error) (*Sentinel, error) {
		s.Close()
		return nil, fmt.Errorf("redistest: start sentinel with %d replicas: %w", replicas, err)
	}
	var err error
	if s.Nodes[0], err = StartServer(); err != nil {
		return fail(err)
	}
	master := s.Nodes[0]
	errs := make([]error, len(s.Nodes))
	var wg sync.WaitGroup
	for i := 1; i < len(s.Nodes); i++ {
		wg.Go(func() {
			s.Nodes[i], errs[i] = StartServer(WithArgs("--replicaof", loopback, strconv.Itoa(master.Port())))
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), sentinelReadyTime)
	defer cancel()
	// A sentinel learns the replicas from the master's INFO, which lists a
	// replica only once it has connected: start the sentinels after that.
	if err := poll(ctx, "replicas in sync with the master", s.checkReplicas); err != nil {
		return fail(err)
	}

	conf := fmt.Sprintf("sentinel monitor %[1]s %[2]s %[3]d %[4]d\n"+
		"sentinel down-after-milliseconds %[1]s %[5]d\n"+
		"sentinel failover-timeout %[1]s %[6]d\n"+
		"sentinel parallel-syncs %[1]s 1\n",
		SentinelMasterName, loopback, master.Port(), sentinelQuorum,
		SentinelDownAfter.Milliseconds(), SentinelFailoverTimeout.Milliseconds())
	errs = make([]error, len(s.Sentinels))
	for i := range s.Sentinels {
		wg.Go(func() { s.Sentinels[i], errs[i] = StartServer(withSentinel(conf)) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fail(err)
	}
	// Sentinels find each other through hello messages on the master,
	// every 2 s.
	if err := poll(ctx, "every sentinel to know the master, its replicas and the other sentinels", s.checkSentinels); err != nil {
		return fail(err)
	}
	return s, nil
}

// NewSentinel starts a deployment like StartSentinel, calls tb.Fatal if that
// fails and registers Close with tb.Cleanup.
func NewSentinel(tb testing.TB, replicas int) *Sentinel {
	tb.Helper()
	s, err := StartSentinel(replicas)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// SentinelAddrs returns the "127.0.0.1:PORT" addresses of the sentinels, the
// SentinelAddrs of a go-redis failover client.
func (s *Sentinel) SentinelAddrs() []string {
	addrs := make([]string, len(s.Sentinels))
	for i, n := range s.Sentinels {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Client returns a new go-redis failover client (redis.NewFailoverClient)
// for the deployment and closes it on tb.Cleanup. Like Server.Client it has
// ContextTimeoutEnabled. It asks a sentinel for the master's address on
// every new connection and, told of a failover (+switch-master), drops its
// connections to the old master.
func (s *Sentinel) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            SentinelMasterName,
		SentinelAddrs:         s.SentinelAddrs(),
		ContextTimeoutEnabled: true,
	})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Master returns the data server that every sentinel answering within a
// second names as the master (SENTINEL GET-MASTER-ADDR-BY-NAME), provided at
// least a quorum of them answer and that server itself says it is a master
// (ROLE). Otherwise, as during a failover, it returns an error.
func (s *Sentinel) Master(ctx context.Context) (*Server, error) {
	addrs := make([]string, len(s.Sentinels))
	errs := make([]error, len(s.Sentinels))
	var wg sync.WaitGroup
	for i, n := range s.Sentinels {
		if !n.Running() {
			errs[i] = fmt.Errorf("sentinel %s is stopped", n.Addr())
			continue
		}
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			sc := sentinelClient(n)
			defer sc.Close()
			hp, err := sc.GetMasterAddrByName(sctx, SentinelMasterName).Result()
			switch {
			case err != nil:
				errs[i] = fmt.Errorf("sentinel %s: %w", n.Addr(), err)
			case len(hp) != 2:
				errs[i] = fmt.Errorf("sentinel %s: master address %q", n.Addr(), hp)
			default:
				addrs[i] = net.JoinHostPort(hp[0], hp[1])
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("redistest: sentinel master: %w", err)
	}
	answered := 0
	addr := ""
	for _, a := range addrs {
		if a == "" {
			continue
		}
		if addr != "" && a != addr {
			return nil, fmt.Errorf("redistest: sentinel master: sentinels disagree: %q", addrs)
		}
		addr = a
		answered++
	}
	if answered < sentinelQuorum {
		return nil, fmt.Errorf("redistest: sentinel master: %d of %d sentinels answered: %w", answered, len(s.Sentinels), errors.Join(errs...))
	}
	m := s.node(addr)
	if m == nil {
		return nil, fmt.Errorf("redistest: sentinel master: sentinels name %s, which is none of %s", addr, s)
	}
	nctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	rc := nodeClient(m)
	defer rc.Close()
	role, err := rc.Do(nctx, "ROLE").Slice()
	if err != nil || len(role) == 0 || role[0] != "master" {
		return nil, fmt.Errorf("redistest: sentinel master: sentinels name %s, whose ROLE is %v, %v", addr, role, err)
	}
	return m, nil
}

// KillMaster crashes the current master (SIGKILL, see Server.Stop) and waits
// until the sentinels agree on a promoted replica, which it returns with the
// old master. It takes about SentinelDownAfter plus a few seconds of
// election and promotion; call it with a context that allows for a failed
// election round (2×SentinelFailoverTimeout) on a loaded machine.
func (s *Sentinel) KillMaster(ctx context.Context) (old, promoted *Server, err error) {
	old, err = s.Master(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("redistest: kill sentinel master: %w", err)
	}
	if err := old.Stop(); err != nil {
		return old, nil, fmt.Errorf("redistest: kill sentinel master: %w", err)
	}
	var last error
	for {
		m, err := s.Master(ctx)
		if err == nil && m != old {
			return old, m, nil
		}
		if err == nil {
			err = fmt.Errorf("sentinels still name %s", old.Addr())
		}
		last = err
		select {
		case <-ctx.Done():
			return old, nil, fmt.Errorf("redistest: kill sentinel master %s: no replica promoted: %w", old.Addr(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Close closes every sentinel and data server (see Server.Close). It is
// idempotent.
func (s *Sentinel) Close() {
	s.closeOnce.Do(func() {
		var wg sync.WaitGroup
		for _, n := range append(append([]*Server(nil), s.Sentinels...), s.Nodes...) {
			if n != nil {
				wg.Go(n.Close)
			}
		}
		wg.Wait()
	})
}

// String describes the deployment for test logs.
func (s *Sentinel) String() string {
	var data []string
	for _, n := range s.Nodes {
		if n != nil {
			data = append(data, n.Addr())
		}
	}
	return fmt.Sprintf("redis sentinel %q of %s watched by %s", SentinelMasterName,
		strings.Join(data, ","), strings.Join(s.SentinelAddrs(), ","))
}

// node returns the data server at addr, or nil.
func (s *Sentinel) node(addr string) *Server {
	for _, n := range s.Nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// checkReplicas checks that every replica's link to the master is up.
func (s *Sentinel) checkReplicas(ctx context.Context) error {
	for _, n := range s.Nodes[1:] {
		rc := nodeClient(n)
		repl, err := rc.Info(ctx, "replication").Result()
		rc.Close()
		if err != nil {
			return fmt.Errorf("INFO replication on %s: %w", n.Addr(), err)
		}
		if link, _ := infoField(repl, "master_link_status"); link != "up" {
			return fmt.Errorf("replica %s reports master_link_status:%s", n.Addr(), link)
		}
	}
	return nil
}

// checkSentinels checks that every sentinel sees the master up, all its
// replicas connected, and the other sentinels.
func (s *Sentinel) checkSentinels(ctx context.Context) error {
	for _, n := range s.Sentinels {
		sc := sentinelClient(n)
		err := s.checkSentinel(ctx, sc)
		sc.Close()
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", n.Addr(), err)
		}
	}
	return nil
}

func (s *Sentinel) checkSentinel(ctx context.Context, sc *redis.SentinelClient) error {
	m, err := sc.Master(ctx, SentinelMasterName).Result()
	if err != nil {
		return fmt.Errorf("SENTINEL MASTER: %w", err)
	}
	if got, want := net.JoinHostPort(m["ip"], m["port"]), s.Nodes[0].Addr(); got != want {
		return fmt.Errorf("master at %s, want %s", got, want)
	}
	if m["flags"] != "master" {
		return fmt.Errorf("master flags %q", m["flags"])
	}
	if got, want := m["num-other-sentinels"], strconv.Itoa(len(s.Sentinels)-1); got != want {
		return fmt.Errorf("knows %s other sentinels, want %s", got, want)
	}
	replicas, err := sc.Replicas(ctx, SentinelMasterName).Result()
	if err != nil {
		return fmt.Errorf("SENTINEL REPLICAS: %w", err)
	}
	ok := 0
	for _, r := range replicas {
		if r["flags"] == "slave" && r["master-link-status"] == "ok" {
			ok++
		}
	}
	if want := len(s.Nodes) - 1; ok != want {
		return fmt.Errorf("sees %d of %d replicas connected and in sync: %v", ok, want, replicas)
	}
	return nil
}

// sentinelClient is a client for one sentinel that gives up quickly.
func sentinelClient(s *Server) *redis.SentinelClient {
	return redis.NewSentinelClient(&redis.Options{
		Addr:                  s.Addr(),
		DialTimeout:           time.Second,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		PoolSize:              2,
	})
}
