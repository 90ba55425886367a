// Package faulttest holds tollgate's fault tests: redisstore under load from
// many goroutines while real redis-server processes (started by
// internal/test/redistest) crash, hang, come back empty, fail over or move slots.
// It has no code of its own besides this comment; the tests are the point.
//
// What the tests establish, each on real processes:
//
//   - Standalone Redis killed and restarted: decisions fail while it is down
//     and resume after it is back; nothing panics, and no call outlives its
//     deadline.
//   - Redis paused with SIGSTOP (a hung server, the worst case for
//     deadlines: connections stay open and nothing answers): every decision
//     returns within its deadline plus a small margin.
//   - Redis restarted empty: all state is lost, so every key has its full
//     allowance again; the tests pin down exactly what a client sees.
//   - A long outage leaks neither goroutines (go.uber.org/goleak checks the
//     whole package) nor memory (the heap is measured before and after).
//   - Redis Cluster: every algorithm on keys spread over all masters; a
//     manual CLUSTER FAILOVER and a crashed master under load (decisions
//     resume, MOVED is followed, admitted counts stay exact across a manual
//     failover); a slot moved under load (ASK is followed); a master without
//     the scripts (NOSCRIPT, answered by the EVALSHA → EVAL fallback); and
//     never a CROSSSLOT error.
//   - Redis Sentinel: the master killed under load; decisions resume
//     through the promoted replica within a bound derived from the
//     sentinels' timeouts, and the gap is measured.
//
// Each test logs what it measured (gaps, durations, error kinds); the
// docs/operations.md, "Failures", quotes them.
package faulttest
