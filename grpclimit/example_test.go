package grpclimit_test

import (
	"log"

	"google.golang.org/grpc"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/grpclimit"
	"github.com/tollgate/tollgate/memorystore"
)

// Per-API-key limits on one service, and a per-peer limit on everything.
// With redisstore.New(rdb) instead of the memory store, every replica
// shares them.
func Example() {
	lim, err := grpclimit.New(memorystore.New(), []grpclimit.Rule{
		{
			Name:     "reports",
			Method:   "/acme.Reports/*",
			Key:      grpclimit.Metadata("x-api-key"),
			Policies: []grpclimit.Policy{{Name: "reports", Limit: tollgate.PerMinute(60)}},
		},
		{
			Name:     "peer",
			Policies: []grpclimit.Policy{{Name: "peer", Limit: tollgate.PerSecond(100)}},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(lim.StreamServerInterceptor()),
	)
	_ = srv // register services, then srv.Serve(listener)
}
