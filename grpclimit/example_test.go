package grpclimit_test

import (
	"context"
	"log"

	"google.golang.org/grpc"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
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
			Policies: []enforce.Policy{{Name: "reports", Limit: tollgate.PerMinute(60)}},
		},
		{
			Name:     "peer",
			Policies: []enforce.Policy{{Name: "peer", Limit: tollgate.PerSecond(100)}},
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

// A completion service billed in tokens: each call reserves an estimate of
// 500 of its tenant's 10,000 tokens a minute, and is settled to the count
// the handler reports in the x-tokens-used trailer (grpc.SetTrailer),
// which clients do not see; the server's own failures are refunded.
func ExampleSettle() {
	tenant := grpclimit.Metadata("x-tenant")
	lim, err := grpclimit.New(memorystore.New(), []grpclimit.Rule{{
		Name:     "completions",
		Method:   "/acme.Model/Complete",
		Key:      tenant,
		Policies: []enforce.Policy{{Name: "tokens", Limit: tollgate.PerMinute(10_000)}},
		Cost:     func(context.Context, string) int { return 500 },
		Settle:   &grpclimit.Settle{Trailer: "x-tokens-used", Hide: true, Refund: grpclimit.ServerError},
	}})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(lim.StreamServerInterceptor()),
	)
	_ = srv // register the service, srv.Serve(listener); at shutdown srv.GracefulStop(), then lim.Drain(ctx)
}
