package redistest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterNodeTimeout is the cluster-node-timeout of every cluster node: how
// long a master must be unreachable before the others mark it failed and
// elect its replica in its place. Redis's default is 15 s; tests that wait
// for a failover need it short.
const ClusterNodeTimeout = 2 * time.Second

const (
	clusterSlots     = 16384
	defaultMasters   = 3
	clusterReadyTime = 20 * time.Second // max time to form the cluster once nodes run
)

// Cluster is a Redis Cluster of masters, each optionally with replicas, all on
// 127.0.0.1.
type Cluster struct {
	// Nodes are the cluster's servers. Nodes[:masters] were created as
	// masters, master i owning the i-th of equal slot ranges; replica j of
	// master i is Nodes[masters+i*replicasPerMaster+j]. Roles change after a
	// failover: use Masters to learn the current ones.
	Nodes []*Server

	masters, replicasPerMaster int
	closeOnce                  sync.Once
}

// StartCluster starts masters*(1+replicasPerMaster) cluster-enabled
// redis-server processes, assigns all 16384 slots evenly to the masters, joins
// the nodes, attaches the replicas, and waits until every node reports
// cluster_state:ok and the same complete slot map. masters <= 0 means 3.
// Options apply to every node, e.g. WithArgs("--cluster-require-full-coverage",
// "no"). It is meant for TestMain; the caller must call Close. Tests should
// use NewCluster.
func StartCluster(masters, replicasPerMaster int, opts ...Option) (*Cluster, error) {
	if masters <= 0 {
		masters = defaultMasters
	}
	if replicasPerMaster < 0 {
		return nil, fmt.Errorf("redistest: start cluster: negative replicasPerMaster %d", replicasPerMaster)
	}
	if masters > clusterSlots {
		return nil, fmt.Errorf("redistest: start cluster: %d masters is more than %d slots", masters, clusterSlots)
	}
	c := &Cluster{
		Nodes:             make([]*Server, masters*(1+replicasPerMaster)),
		masters:           masters,
		replicasPerMaster: replicasPerMaster,
	}
	errs := make([]error, len(c.Nodes))
	var wg sync.WaitGroup
	for i := range c.Nodes {
		wg.Go(func() { c.Nodes[i], errs[i] = StartServer(append([]Option{withCluster()}, opts...)...) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Close()
		return nil, fmt.Errorf("redistest: start cluster: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterReadyTime)
	defer cancel()
	if err := c.form(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("redistest: start cluster of %d masters with %d replicas each: %w", masters, replicasPerMaster, err)
	}
	return c, nil
}

// NewCluster starts a cluster like StartCluster, calls tb.Fatal if that fails
// and registers Close with tb.Cleanup.
func NewCluster(tb testing.TB, masters, replicasPerMaster int, opts ...Option) *Cluster {
	tb.Helper()
	c, err := StartCluster(masters, replicasPerMaster, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

// Addrs returns the "127.0.0.1:PORT" addresses of all nodes, in Nodes order.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Client returns a new go-redis cluster client seeded with all nodes and
// closes it on tb.Cleanup. Like Server.Client it has ContextTimeoutEnabled.
// Its ClusterStateReloadInterval is 1 s instead of go-redis's 60 s: go-redis
// reloads the slot map only on MOVED/ASK or when it is that old, not when a
// master refuses connections, so after a failover the default client keeps
// sending a crashed master's slots to the dead address for up to a minute.
func (c *Cluster) Client(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                      c.Addrs(),
		ContextTimeoutEnabled:      true,
		ClusterStateReloadInterval: time.Second,
	})
	tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Masters returns the nodes that say they are masters right now (ROLE), in
// Nodes order. Nodes that are stopped, paused or do not answer within a
// second are left out. It fails only if ctx ends first. During a failover
// the promoted replica says "master" a moment before the other nodes (and so
// CLUSTER SLOTS and cluster clients) agree.
func (c *Cluster) Masters(ctx context.Context) ([]*Server, error) {
	isMaster := make([]bool, len(c.Nodes))
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		wg.Go(func() {
			nctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			rc := nodeClient(n)
			defer rc.Close()
			role, err := rc.Do(nctx, "ROLE").Slice()
			isMaster[i] = err == nil && len(role) > 0 && role[0] == "master"
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("redistest: cluster masters: %w", err)
	}
	var ms []*Server
	for i, n := range c.Nodes {
		if isMaster[i] {
			ms = append(ms, n)
		}
	}
	return ms, nil
}

// Close closes every node (see Server.Close). It is idempotent.
func (c *Cluster) Close() {
	c.closeOnce.Do(func() {
		var wg sync.WaitGroup
		for _, n := range c.Nodes {
			if n != nil {
				wg.Go(n.Close)
			}
		}
		wg.Wait()
	})
}

// nodeClient is a go-redis client for one node that gives up quickly, for
// administrative commands.
func nodeClient(s *Server) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:                  s.Addr(),
		DialTimeout:           time.Second,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		PoolSize:              2,
	})
}

// form turns freshly started, empty cluster nodes into one cluster.
func (c *Cluster) form(ctx context.Context) error {
	clients := make([]*redis.Client, len(c.Nodes))
	for i, n := range c.Nodes {
		clients[i] = nodeClient(n)
		defer clients[i].Close()
	}
	ids := make([]string, len(c.Nodes))
	for i, rc := range clients {
		id, err := rc.ClusterMyID(ctx).Result()
		if err != nil {
			return fmt.Errorf("CLUSTER MYID on %s: %w", c.Nodes[i].Addr(), err)
		}
		ids[i] = id
		// Distinct config epochs up front, as redis-cli --cluster create
		// does, instead of waiting for the nodes to resolve the collision.
		if err := rc.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fmt.Errorf("CLUSTER SET-CONFIG-EPOCH on %s: %w", c.Nodes[i].Addr(), err)
		}
	}
	for i := range c.masters {
		lo, hi := c.slotRange(i)
		if err := clients[i].ClusterAddSlotsRange(ctx, lo, hi).Err(); err != nil {
			return fmt.Errorf("CLUSTER ADDSLOTSRANGE %d %d on %s: %w", lo, hi, c.Nodes[i].Addr(), err)
		}
	}
	// MEET must name the bus port: without it Redis assumes port+10000.
	// go-redis's ClusterMeet has no parameter for it, hence Do.
	first := c.Nodes[0]
	for i := 1; i < len(c.Nodes); i++ {
		if err := clients[i].Do(ctx, "CLUSTER", "MEET", loopback, first.port, first.busPort).Err(); err != nil {
			return fmt.Errorf("CLUSTER MEET from %s to %s: %w", c.Nodes[i].Addr(), first.Addr(), err)
		}
	}
	// A replica can only REPLICATE a master it knows; wait for the full mesh.
	if err := poll(ctx, "all nodes to know each other", func(ctx context.Context) error {
		return c.checkMesh(ctx, clients, ids)
	}); err != nil {
		return err
	}
	for i := c.masters; i < len(c.Nodes); i++ {
		m := c.masterOf(i)
		if err := clients[i].ClusterReplicate(ctx, ids[m]).Err(); err != nil {
			return fmt.Errorf("CLUSTER REPLICATE %s on %s: %w", ids[m], c.Nodes[i].Addr(), err)
		}
	}
	return poll(ctx, "cluster_state:ok and the same slot map on every node", func(ctx context.Context) error {
		return c.checkReady(ctx, clients, ids)
	})
}

// slotRange returns the slots of master i: an even split of 0..16383.
func (c *Cluster) slotRange(i int) (lo, hi int) {
	return i * clusterSlots / c.masters, (i+1)*clusterSlots/c.masters - 1
}

// masterOf returns the index of the master that node i replicates.
func (c *Cluster) masterOf(i int) int { return (i - c.masters) / c.replicasPerMaster }

// checkMesh checks that every node's CLUSTER NODES lists every node by its
// real ID and loopback address, connected and not in handshake or failing.
func (c *Cluster) checkMesh(ctx context.Context, clients []*redis.Client, ids []string) error {
	for i, rc := range clients {
		text, err := rc.ClusterNodes(ctx).Result()
		if err != nil {
			return fmt.Errorf("CLUSTER NODES on %s: %w", c.Nodes[i].Addr(), err)
		}
		seen := map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
			// <id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slots>...
			f := strings.Fields(line)
			if len(f) < 8 {
				continue
			}
			j := slices.Index(ids, f[0])
			if j < 0 {
				continue
			}
			want := fmt.Sprintf("%s@%d", c.Nodes[j].Addr(), c.Nodes[j].busPort)
			addr, _, _ := strings.Cut(f[1], ",")
			switch {
			case addr != want:
				return fmt.Errorf("%s sees %s at %s, want %s", c.Nodes[i].Addr(), f[0], addr, want)
			case strings.Contains(f[2], "handshake") || strings.Contains(f[2], "noaddr") || strings.Contains(f[2], "fail"):
				return fmt.Errorf("%s sees %s with flags %s", c.Nodes[i].Addr(), addr, f[2])
			case f[7] != "connected":
				return fmt.Errorf("%s sees %s %s", c.Nodes[i].Addr(), addr, f[7])
			}
			seen[f[0]] = true
		}
		if len(seen) != len(ids) {
			return fmt.Errorf("%s knows %d of %d nodes", c.Nodes[i].Addr(), len(seen), len(ids))
		}
	}
	return nil
}

// checkReady checks that every node says cluster_state:ok, that its CLUSTER
// SLOTS covers all 16384 slots exactly as assigned, each range listing its
// master and all of that master's replicas, and that every replica's link to
// its master is up.
func (c *Cluster) checkReady(ctx context.Context, clients []*redis.Client, ids []string) error {
	for i, rc := range clients {
		addr := c.Nodes[i].Addr()
		info, err := rc.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("CLUSTER INFO on %s: %w", addr, err)
		}
		if state, _ := infoField(info, "cluster_state"); state != "ok" {
			return fmt.Errorf("%s reports cluster_state:%s", addr, state)
		}
		//lint:ignore SA1019 go-redis's ClusterClient builds its slot map from CLUSTER SLOTS (v9.23), so that is the view to check
		slots, err := rc.ClusterSlots(ctx).Result()
		if err != nil {
			return fmt.Errorf("CLUSTER SLOTS on %s: %w", addr, err)
		}
		if err := c.checkSlots(slots, ids); err != nil {
			return fmt.Errorf("CLUSTER SLOTS on %s: %w", addr, err)
		}
		if i >= c.masters {
			repl, err := rc.Info(ctx, "replication").Result()
			if err != nil {
				return fmt.Errorf("INFO replication on %s: %w", addr, err)
			}
			if link, _ := infoField(repl, "master_link_status"); link != "up" {
				return fmt.Errorf("replica %s reports master_link_status:%s", addr, link)
			}
		}
	}
	return nil
}

func (c *Cluster) checkSlots(slots []redis.ClusterSlot, ids []string) error {
	slices.SortFunc(slots, func(a, b redis.ClusterSlot) int { return a.Start - b.Start })
	if len(slots) != c.masters {
		return fmt.Errorf("%d slot ranges, want %d", len(slots), c.masters)
	}
	covered := 0
	for i, r := range slots {
		lo, hi := c.slotRange(i)
		if r.Start != lo || r.End != hi {
			return fmt.Errorf("range %d-%d, want %d-%d", r.Start, r.End, lo, hi)
		}
		want := []string{c.Nodes[i].Addr()}
		for j := range c.replicasPerMaster {
			want = append(want, c.Nodes[c.masters+i*c.replicasPerMaster+j].Addr())
		}
		got := make([]string, len(r.Nodes))
		for k, n := range r.Nodes {
			got[k] = n.Addr
		}
		if len(got) == 0 || got[0] != want[0] || r.Nodes[0].ID != ids[i] {
			return fmt.Errorf("slots %d-%d served by %v, want master %s", lo, hi, got, want[0])
		}
		slices.Sort(got[1:])
		slices.Sort(want[1:])
		if !slices.Equal(got, want) {
			return fmt.Errorf("slots %d-%d served by %v, want %v", lo, hi, got, want)
		}
		covered += r.End - r.Start + 1
	}
	if covered != clusterSlots {
		return fmt.Errorf("%d slots covered, want %d", covered, clusterSlots)
	}
	return nil
}

// String describes the cluster for test logs.
func (c *Cluster) String() string {
	return fmt.Sprintf("redis cluster of %d masters with %d replicas each at %s",
		c.masters, c.replicasPerMaster, strings.Join(c.Addrs(), ","))
}

// Node returns the node at addr ("127.0.0.1:PORT", as CLUSTER SLOTS and
// MOVED replies name nodes), or nil if none is.
func (c *Cluster) Node(addr string) *Server {
	for _, n := range c.Nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}
