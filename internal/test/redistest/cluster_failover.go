package redistest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

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
// running node knows as master's replica (see checkReplicaOf), waiting up
// to replicaWait for one: on a busy machine a replica's link may still be
// coming up (ROLE says "connecting" or "sync") or the others may not yet
// know it, a few seconds after the cluster or its last failover settled.
func (c *Cluster) replicaOf(ctx context.Context, master *Server) (*Server, error) {
	ctx, cancel := context.WithTimeout(ctx, replicaWait)
	defer cancel()
	var found *Server
	err := poll(ctx, "a connected replica of "+master.Addr(), func(ctx context.Context) error {
		var errs []string
		for _, n := range c.Nodes {
			if n == master || !n.Running() {
				continue
			}
			err := c.checkReplicaOf(ctx, n, master)
			if err == nil {
				found = n
				return nil
			}
			errs = append(errs, err.Error())
		}
		return errors.New(strings.Join(errs, "; "))
	})
	if err != nil {
		return nil, fmt.Errorf("%s has no connected replica: %w", master.Addr(), err)
	}
	return found, nil
}

// replicaWait is how long replicaOf waits for a master's replica to be
// connected and known to every node.
const replicaWait = 15 * time.Second

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
