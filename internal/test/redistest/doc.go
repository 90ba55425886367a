// Package redistest starts real redis-server processes, standalone, as Redis
// Cluster and as a Redis Sentinel deployment, for tollgate's tests.
//
// Tests use real processes instead of mocks or in-process fakes such as
// miniredis because the rate limiter depends on behaviour that only the real
// server has: Lua script semantics and atomicity, EVALSHA/NOSCRIPT after a
// restart, key expiry, maxmemory eviction, MOVED/ASK redirections and
// CROSSSLOT errors in a cluster, failover of a master to its replica, and
// what a client sees when the server crashes (Server.Stop) or hangs
// (Server.Pause). A fake that gets any of these subtly wrong makes the tests
// prove nothing about production.
//
// Failovers are real too. A Cluster fails over with a manual CLUSTER
// FAILOVER (Cluster.Failover) or after its master crashes
// (Cluster.KillMaster), and moves a slot with its keys as a resharding does
// (Cluster.MoveSlot). A Sentinel deployment is a master, its replicas and
// three sentinels (quorum 2) that promote a replica when the master dies
// (Sentinel.KillMaster). Their timeouts — ClusterNodeTimeout,
// SentinelDownAfter, SentinelFailoverTimeout — are seconds instead of
// Redis's defaults of 15 and 30 s, so a failover test takes seconds; tests
// that bound how long a failover may take should derive the bound from them.
//
// Every server listens on a free port on 127.0.0.1 chosen at start, keeps no
// data on disk (no RDB snapshots, no AOF) and lives in its own temporary
// directory. Processes are started with Setpgid and, on Linux, with
// Pdeathsig=SIGKILL so that they never outlive the test binary, even when it
// panics or is killed by the go test timeout. Always pair StartServer,
// StartCluster and StartSentinel with Close (NewServer, NewCluster and
// NewSentinel register it with tb.Cleanup).
//
// The redis-server binary is looked up in PATH and then at
// /usr/bin/redis-server. When it is missing, starting fails with an error that
// says how to install it; tests must fail rather than skip in that case.
//
// All types are safe for concurrent use by parallel tests.
package redistest
