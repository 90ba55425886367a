package redistest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
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

// migrateBatch is how many keys MoveSlot moves per MIGRATE. It is small on
// purpose: the slot then stays MIGRATING for a while, and clients under load
// meet ASK redirections, which is what tests of slot moves are after.
const migrateBatch = 10

// slotRange is an inclusive range of cluster slots.
type slotRange struct{ lo, hi int }

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

// Failover makes a replica of master take over its slots with CLUSTER
// FAILOVER, the manual failover an operator runs before maintenance: the
// master stops accepting writes until the replica has caught up with its
// replication stream, so no write is lost, and then the replica is elected.
// Failover waits until every running node reports the replica as the master
// of those slots and cluster_state:ok, and the old master is a connected
// replica of the new one (so a later failover can go back); it returns the
// promoted replica. master must be running and have a connected replica.
func (c *Cluster) Failover(ctx context.Context, master *Server) (*Server, error) {
	fail := func(err error) (*Server, error) {
		return nil, fmt.Errorf("redistest: fail over %s: %w", master.Addr(), err)
	}
	owned, err := c.slotsOf(ctx, master)
	if err != nil {
		return fail(err)
	}
	replica, err := c.replicaOf(ctx, master)
	if err != nil {
		return fail(err)
	}
	rc := nodeClient(replica)
	defer rc.Close()
	if err := rc.ClusterFailover(ctx).Err(); err != nil {
		return fail(fmt.Errorf("CLUSTER FAILOVER on %s: %w", replica.Addr(), err))
	}
	if err := poll(ctx, "the replica "+replica.Addr()+" to take over", func(ctx context.Context) error {
		_, err := c.checkTakeover(ctx, master, replica, owned)
		return err
	}); err != nil {
		return fail(err)
	}
	if err := poll(ctx, "the old master to replicate the new one", func(ctx context.Context) error {
		return c.checkReplicaOf(ctx, master, replica)
	}); err != nil {
		return fail(err)
	}
	return replica, nil
}

// KillMaster crashes master (SIGKILL, see Server.Stop) and waits until one
// of its replicas has been elected in its place: every running node reports
// it as the master of the old master's slots, and cluster_state:ok. It
// returns the promoted replica. This takes ClusterNodeTimeout for the other
// masters to mark master failed, plus about a second of election. Writes
// the replica had not received when master died are lost, as in production.
func (c *Cluster) KillMaster(ctx context.Context, master *Server) (*Server, error) {
	fail := func(err error) (*Server, error) {
		return nil, fmt.Errorf("redistest: kill cluster master %s: %w", master.Addr(), err)
	}
	owned, err := c.slotsOf(ctx, master)
	if err != nil {
		return fail(err)
	}
	if _, err := c.replicaOf(ctx, master); err != nil {
		return fail(err)
	}
	if err := master.Stop(); err != nil {
		return fail(err)
	}
	var owner string
	if err := poll(ctx, "a replica to take over", func(ctx context.Context) (err error) {
		owner, err = c.checkTakeover(ctx, master, nil, owned)
		return err
	}); err != nil {
		return fail(err)
	}
	promoted := c.Node(owner)
	if promoted == nil {
		return fail(fmt.Errorf("the nodes name %s, which is none of %s", owner, c))
	}
	return promoted, nil
}

// MoveSlot moves slot, with its keys, to the master to, the way redis-cli
// --cluster reshard does: the target is marked IMPORTING and the owner
// MIGRATING, the keys are moved in batches of migrateBatch with MIGRATE
// (while a slot is MIGRATING, its owner answers ASK for keys it no longer
// has, and clients retry those on the target with ASKING), and then every
// master is told the slot's new owner (clients that ask the old owner get
// MOVED). MoveSlot waits until every running node agrees. Moving a slot to
// its owner does nothing.
func (c *Cluster) MoveSlot(ctx context.Context, slot int, to *Server) error {
	fail := func(err error) error {
		return fmt.Errorf("redistest: move slot %d to %s: %w", slot, to.Addr(), err)
	}
	if slot < 0 || slot >= clusterSlots {
		return fail(errors.New("no such slot"))
	}
	slots, err := nodeSlots(ctx, to)
	if err != nil {
		return fail(err)
	}
	from := c.Node(ownerOf(slots, slot))
	if from == nil {
		return fail(fmt.Errorf("%s knows no owner among the nodes", to.Addr()))
	}
	if from == to {
		return nil
	}
	src, dst := nodeClient(from), nodeClient(to)
	defer src.Close()
	defer dst.Close()
	srcID, err := src.ClusterMyID(ctx).Result()
	if err != nil {
		return fail(err)
	}
	dstID, err := dst.ClusterMyID(ctx).Result()
	if err != nil {
		return fail(err)
	}
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err(); err != nil {
		return fail(fmt.Errorf("SETSLOT IMPORTING on %s: %w", to.Addr(), err))
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err(); err != nil {
		return fail(fmt.Errorf("SETSLOT MIGRATING on %s: %w", from.Addr(), err))
	}
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, migrateBatch).Result()
		if err != nil {
			return fail(err)
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", loopback, to.Port(), "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Do(ctx, args...).Err(); err != nil {
			return fail(fmt.Errorf("MIGRATE from %s: %w", from.Addr(), err))
		}
	}
	// The target first, so that it serves the slot before the old owner
	// starts sending clients there with MOVED; then every other master.
	masters, err := c.Masters(ctx)
	if err != nil {
		return fail(err)
	}
	order := []*Server{to, from}
	for _, m := range masters {
		if m != to && m != from {
			order = append(order, m)
		}
	}
	for _, m := range order {
		mc := nodeClient(m)
		err := mc.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err()
		mc.Close()
		if err != nil {
			return fail(fmt.Errorf("SETSLOT NODE on %s: %w", m.Addr(), err))
		}
	}
	if err := poll(ctx, "every node to agree", func(ctx context.Context) error {
		_, err := c.checkTakeover(ctx, from, to, []slotRange{{slot, slot}})
		return err
	}); err != nil {
		return fail(err)
	}
	return nil
}

// slotsOf returns the slot ranges master serves, as it says itself.
func (c *Cluster) slotsOf(ctx context.Context, master *Server) ([]slotRange, error) {
	slots, err := nodeSlots(ctx, master)
	if err != nil {
		return nil, err
	}
	var owned []slotRange
	for _, r := range slots {
		if len(r.Nodes) > 0 && r.Nodes[0].Addr == master.Addr() {
			owned = append(owned, slotRange{r.Start, r.End})
		}
	}
	if len(owned) == 0 {
		return nil, fmt.Errorf("%s serves no slots", master.Addr())
	}
	return owned, nil
}

// replicaOf returns a running node that replicates master and that every
// running node knows as master's replica (see checkReplicaOf).
func (c *Cluster) replicaOf(ctx context.Context, master *Server) (*Server, error) {
	var last error
	for _, n := range c.Nodes {
		if n == master || !n.Running() {
			continue
		}
		if last = c.checkReplicaOf(ctx, n, master); last == nil {
			return n, nil
		}
	}
	return nil, fmt.Errorf("%s has no connected replica: %w", master.Addr(), last)
}

// checkReplicaOf checks that n replicates master with its link up (see
// checkRole) and that every running node's CLUSTER NODES says so too. The second matters: a replica
// that the others do not yet know as such (right after a failover, until
// gossip spreads it) has its CLUSTER FAILOVER ignored by its master and its
// election refused by the other masters.
func (c *Cluster) checkReplicaOf(ctx context.Context, n, master *Server) error {
	if err := checkRole(ctx, n, master); err != nil {
		return err
	}
	nctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	want := fmt.Sprintf("%s@%d", master.Addr(), master.busPort)
	for _, o := range c.Nodes {
		if !o.Running() {
			continue
		}
		oc := nodeClient(o)
		text, err := oc.ClusterNodes(nctx).Result()
		oc.Close()
		if err != nil {
			return fmt.Errorf("CLUSTER NODES on %s: %w", o.Addr(), err)
		}
		if err := checkNodesReplica(text, n, want); err != nil {
			return fmt.Errorf("%s: %w", o.Addr(), err)
		}
	}
	return nil
}

// checkRole checks that n's ROLE says it replicates master with its link up:
// "slave", master ip, master port, "connected", offset.
func checkRole(ctx context.Context, n, master *Server) error {
	nctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	rc := nodeClient(n)
	defer rc.Close()
	role, err := rc.Do(nctx, "ROLE").Slice()
	if err != nil {
		return fmt.Errorf("ROLE on %s: %w", n.Addr(), err)
	}
	if len(role) < 4 || role[0] != "slave" || fmt.Sprint(role[2]) != strconv.Itoa(master.Port()) || role[3] != "connected" {
		return fmt.Errorf("ROLE on %s = %v, want a connected replica of %s", n.Addr(), role, master.Addr())
	}
	return nil
}

// checkNodesReplica checks that a CLUSTER NODES reply lists n as a replica
// of the master whose address is masterAddr ("ip:port@busport").
func checkNodesReplica(text string, n *Server, masterAddr string) error {
	ids := map[string]string{} // address -> node ID
	var replicaOf string
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		// <id> <ip:port@cport[,hostname]> <flags> <master> ...
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], ",")
		ids[addr] = f[0]
		if addr == fmt.Sprintf("%s@%d", n.Addr(), n.busPort) {
			if !strings.Contains(f[2], "slave") {
				return fmt.Errorf("%s has flags %s", n.Addr(), f[2])
			}
			replicaOf = f[3]
		}
	}
	if replicaOf == "" || replicaOf != ids[masterAddr] {
		return fmt.Errorf("%s is not known as a replica of %s", n.Addr(), masterAddr)
	}
	return nil
}

// checkTakeover checks that every running node says cluster_state:ok and
// names one and the same master for every range in owned, which is want
// (or, when want is nil, any node but old), and returns its address.
func (c *Cluster) checkTakeover(ctx context.Context, old, want *Server, owned []slotRange) (string, error) {
	owner := ""
	for _, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		nctx, cancel := context.WithTimeout(ctx, time.Second)
		info, err := nodeInfo(nctx, n)
		if err != nil {
			cancel()
			return "", err
		}
		if state, _ := infoField(info, "cluster_state"); state != "ok" {
			cancel()
			return "", fmt.Errorf("%s reports cluster_state:%s", n.Addr(), state)
		}
		slots, err := nodeSlots(nctx, n)
		cancel()
		if err != nil {
			return "", err
		}
		for _, r := range owned {
			for _, s := range []int{r.lo, r.hi} {
				o := ownerOf(slots, s)
				switch {
				case o == "":
					return "", fmt.Errorf("%s knows no owner of slot %d", n.Addr(), s)
				case o == old.Addr():
					return "", fmt.Errorf("%s still names %s as the owner of slot %d", n.Addr(), o, s)
				case want != nil && o != want.Addr():
					return "", fmt.Errorf("%s names %s as the owner of slot %d, want %s", n.Addr(), o, s, want.Addr())
				case owner != "" && o != owner:
					return "", fmt.Errorf("%s names %s as the owner of slot %d, others %s", n.Addr(), o, s, owner)
				}
				owner = o
			}
		}
	}
	if owner == "" {
		return "", errors.New("no running node")
	}
	return owner, nil
}

// nodeSlots asks n for CLUSTER SLOTS.
func nodeSlots(ctx context.Context, n *Server) ([]redis.ClusterSlot, error) {
	rc := nodeClient(n)
	defer rc.Close()
	//lint:ignore SA1019 go-redis's ClusterClient builds its slot map from CLUSTER SLOTS (v9.23), so that is the view to check
	slots, err := rc.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("CLUSTER SLOTS on %s: %w", n.Addr(), err)
	}
	return slots, nil
}

// nodeInfo asks n for CLUSTER INFO.
func nodeInfo(ctx context.Context, n *Server) (string, error) {
	rc := nodeClient(n)
	defer rc.Close()
	info, err := rc.ClusterInfo(ctx).Result()
	if err != nil {
		return "", fmt.Errorf("CLUSTER INFO on %s: %w", n.Addr(), err)
	}
	return info, nil
}

// ownerOf returns the address of the master serving slot in a CLUSTER SLOTS
// reply, or "".
func ownerOf(slots []redis.ClusterSlot, slot int) string {
	for _, r := range slots {
		if r.Start <= slot && slot <= r.End && len(r.Nodes) > 0 {
			return r.Nodes[0].Addr
		}
	}
	return ""
}
