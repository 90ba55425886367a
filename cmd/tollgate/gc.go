package main

import (
	"log/slog"
	"runtime/debug"
)

// redisGCLimit is the soft memory limit that comes with a raised GOGC
// when the store is Redis. The service's own heap is then a few megabytes
// of short-lived request garbage, so the limit is never near in normal
// running; it keeps a burst of garbage from growing the heap to five
// times its live size unchecked.
const redisGCLimit = 256 << 20

// tuneGC sets the garbage collector for the store, unless the operator
// has: GOGC in the environment leaves everything to Go.
//
// With Redis the live heap is small and its garbage short-lived: a GOGC of
// 400 collects a quarter as often, for about a quarter less CPU per
// decision, and costs a few tens of megabytes — bounded by a soft memory
// limit of 256 MiB unless GOMEMLIMIT sets one. With the memory store the
// live heap is the keys themselves, up to hundreds of megabytes: there a
// GOGC of 400 would let the heap grow to five times that, so Go's default
// of 100 stays.
func tuneGC(getenv env, memoryStore bool, log *slog.Logger) {
	if getenv("GOGC") != "" || memoryStore {
		return
	}
	debug.SetGCPercent(400)
	limit := "GOMEMLIMIT"
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(redisGCLimit)
		limit = "256MiB"
	}
	log.Debug("garbage collector tuned for the Redis store", "gogc", 400, "memory_limit", limit)
}
