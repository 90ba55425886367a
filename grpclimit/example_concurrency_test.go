package grpclimit_test

import (
	"context"
	"fmt"
	"log"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/grpclimit"
	"github.com/tollgate/tollgate/memorystore"
)

// At most one export in flight per tenant. With redisstore.New(rdb)
// instead of the memory store, the limit holds across every replica.
// Here the interceptor is called directly: a second export of the same
// tenant, started while the first runs, is denied; another tenant's is not.
func ExampleConcurrency() {
	conc, err := grpclimit.Concurrency(memorystore.New(), grpclimit.ConcurrencyRule{
		Name:   "exports",
		Method: "/acme.Exports/*",
		Key: func(ctx context.Context, _ string) (string, bool) {
			if v := metadata.ValueFromIncomingContext(ctx, "x-tenant"); len(v) > 0 && v[0] != "" {
				return v[0], true
			}
			return "", false
		},
		Max: 1,
	}, enforce.WithTimeout(0)) // memorystore never waits
	if err != nil {
		log.Fatal(err)
	}
	unary := conc.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/acme.Exports/Run"}
	call := func(tenant string, handler grpc.UnaryHandler) error {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-tenant", tenant))
		_, err := unary(ctx, nil, info, handler)
		return err
	}
	done := func(context.Context, any) (any, error) { return nil, nil }
	err = call("acme", func(context.Context, any) (any, error) {
		fmt.Println("acme, while its first export runs:", status.Code(call("acme", done)))
		fmt.Println("globex, meanwhile:", status.Code(call("globex", done)))
		return nil, nil
	})
	fmt.Println("acme's first export:", status.Code(err))
	fmt.Println("acme, afterwards:", status.Code(call("acme", done)))

	// To serve:
	//	srv := grpc.NewServer(
	//		grpc.ChainUnaryInterceptor(conc.UnaryServerInterceptor()),
	//		grpc.ChainStreamInterceptor(conc.StreamServerInterceptor()),
	//	)

	// Output:
	// acme, while its first export runs: ResourceExhausted
	// globex, meanwhile: OK
	// acme's first export: OK
	// acme, afterwards: OK
}
