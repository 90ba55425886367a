// Package lab holds the demos that show, on a real Redis, why tollgate
// decides the way it does. `tollgate demo <name>` and `make <name>` run
// them: the token-bucket script loaded by hand
// (Bucket), a bucket drained (Drain) and refilled (Refill), two processes
// racing a naive limiter and the Lua one (Race), a fixed window overrun at
// its edge (Boundary), and a clock that went back an hour (Skew).
//
// Every demo runs tollgate's production scripts through redisstore — the lab
// shows the code that serves traffic, not a copy of it — against a real
// Redis (see Connect), and takes its time from the Redis server (TIME): no
// demo depends on the application's clock, so they behave the same on any
// OS. The naive limiters the demos compare against (GET-compare-SET, INCR +
// EXPIRE) are written here, plainly, as they are commonly written.
//
// Each demo writes what it shows to an io.Writer. The output of drain,
// refill and skew is the same on every run: keys
// are fresh per run, and durations are rounded up to a tenth of a second.
package lab
