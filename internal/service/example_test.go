package service_test

import (
	"context"
	"fmt"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/internal/service/config"
	"github.com/tollgate/tollgate/memorystore"
)

func ExampleServer_ShouldRateLimit() {
	rules, err := config.Parse("edge.yaml", []byte(`
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {name: per_ip, unit: minute, requests_per_unit: 2}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	now := func() time.Time { return time.Date(2026, 1, 1, 12, 0, 30, 0, time.UTC) }
	srv, err := service.New(memorystore.New(memorystore.WithClock(now)), service.WithClock(now))
	if err != nil {
		fmt.Println(err)
		return
	}
	srv.SetRules(rules)
	req := &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{{
		Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "203.0.113.7"}},
	}}}
	for range 3 {
		resp, err := srv.ShouldRateLimit(context.Background(), req)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Print(resp.OverallCode, " remaining=", resp.Statuses[0].LimitRemaining)
		for _, h := range resp.ResponseHeadersToAdd {
			fmt.Printf(" | %s: %s", h.Key, h.Value)
		}
		fmt.Println()
	}
	// Output:
	// OK remaining=1 | RateLimit-Policy: "per_ip";q=2;w=60 | RateLimit: "per_ip";r=1;t=30
	// OK remaining=0 | RateLimit-Policy: "per_ip";q=2;w=60 | RateLimit: "per_ip";r=0;t=30
	// OVER_LIMIT remaining=0 | RateLimit-Policy: "per_ip";q=2;w=60 | RateLimit: "per_ip";r=0;t=30 | Retry-After: 30
}
