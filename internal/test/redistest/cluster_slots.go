package redistest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// migrateBatch is how many keys MoveSlot moves per MIGRATE. It is small on
// purpose: the slot then stays MIGRATING for a while, and clients under load
// meet ASK redirections, which is what tests of slot moves are after.
const migrateBatch = 10

// slotRange is an inclusive range of cluster slots.
type slotRange struct{ lo, hi int }

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
