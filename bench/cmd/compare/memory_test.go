package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// BenchmarkMemoryRows runs each in-memory row serially, as Go benchmarks
// do, over 100,000 keys in the random order the tables use. Under
// cachegrind, its instruction and cache-miss counts per decision do not
// depend on what else the machine runs:
//
//	go test -c -o /tmp/compare.test ./cmd/compare
//	GOGC=off GODEBUG=asyncpreemptoff=1 valgrind --tool=cachegrind --cache-sim=yes --LL=8388608,16,64 \
//	    /tmp/compare.test -test.run '^$' -test.bench 'MemoryRows/^throttled' -test.benchtime 300000x -test.cpu 1
//
// and once more with -test.benchtime 100000x: the difference over 200,000
// is the cost of one decision (each run builds its row twice, for the
// benchmark's first run of one call and for the run of N). GOGC=off keeps
// collections from moving that difference by tens of instructions;
// asyncpreemptoff keeps valgrind's tools from failing on Go's preemption
// signals.
func BenchmarkMemoryRows(b *testing.B) {
	const nkeys = 100_000
	ctx := context.Background()
	for i, r := range memoryRows() {
		b.Run(regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(r.name), "_"), func(b *testing.B) {
			decide, err := r.build(nil)
			if err != nil {
				b.Fatal(err)
			}
			ks := keys(fmt.Sprintf("m%d:", i), nkeys)
			for _, k := range ks {
				if err := decide(ctx, k); err != nil {
					b.Fatal(err)
				}
			}
			walk := make([]string, nkeys)
			for j, k := range rand.New(rand.NewPCG(1, 2)).Perm(nkeys) {
				walk[j] = ks[k]
			}
			runtime.GC() // no collection of the set-up's garbage in the loop
			b.ReportAllocs()
			b.ResetTimer()
			j := 0
			for range b.N {
				if j++; j == nkeys {
					j = 0
				}
				if err := decide(ctx, walk[j]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMiddlewareRows runs each middleware row serially over 10,000
// client addresses in the random order the tables use, for profiles of one
// row:
//
//	go test -run '^$' -bench 'MiddlewareRows/^tollgate' -benchtime 2000000x -cpuprofile /tmp/mw.pprof ./cmd/compare
func BenchmarkMiddlewareRows(b *testing.B) {
	const nips = 10_000
	reqs := mwRequests(nips)
	walk := make([]*http.Request, nips)
	for j, k := range rand.New(rand.NewPCG(1, 2)).Perm(nips) {
		walk[j] = reqs[k]
	}
	ctx := context.Background()
	for _, r := range middlewareRows() {
		b.Run(regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(r.name), "_"), func(b *testing.B) {
			h, err := r.wrap(mwHandler)
			if err != nil {
				b.Fatal(err)
			}
			serve := serveOne(h)
			for _, req := range reqs {
				if err := serve(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
			runtime.GC()
			b.ReportAllocs()
			b.ResetTimer()
			j := 0
			for range b.N {
				if j++; j == nips {
					j = 0
				}
				if err := serve(ctx, walk[j]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
