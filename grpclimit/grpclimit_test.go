package grpclimit_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/clientip"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/grpclimit"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
)

var server *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &server) }

// newClock returns the clock of a scenario, shared by the store and the
// test.
func newClock() *testkit.Clock { return testkit.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)) }

// serve starts a real gRPC server on loopback with the health service behind
// lim's interceptors, and returns a client connected to it.
func serve(t *testing.T, lim *grpclimit.Limiter) healthpb.HealthClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(lim.StreamServerInterceptor()),
	)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// mustNew makes a Limiter with a generous store deadline (a first call to a
// fresh Redis client dials and loads a script, which on a loaded machine can
// take longer than the 50 ms default), unless opts set one.
func mustNew(t *testing.T, store tollgate.Store, rules []grpclimit.Rule, opts ...enforce.Option) *grpclimit.Limiter {
	t.Helper()
	opts = append([]enforce.Option{enforce.WithTimeout(10 * time.Second)}, opts...)
	lim, err := grpclimit.New(store, rules, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

func check(ctx context.Context, c healthpb.HealthClient, md metadata.MD) (metadata.MD, error) {
	var header metadata.MD
	if md != nil {
		ctx = metadata.NewOutgoingContext(ctx, md)
	}
	_, err := c.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
	return header, err
}

func TestUnary(t *testing.T) {
	t.Parallel()
	for _, b := range testkit.Stores(server.Client) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			lim := mustNew(t, b.New(t, newClock().Now), []grpclimit.Rule{{
				Name:     "health",
				Method:   "/grpc.health.v1.Health/Check",
				Policies: []enforce.Policy{{Name: "checks", Limit: tollgate.PerMinute(2)}},
			}})
			c := serve(t, lim)
			ctx := context.Background()
			for i := 1; i <= 2; i++ {
				md, err := check(ctx, c, nil)
				if err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
				list, err := httpsfv.UnmarshalList(md.Get("ratelimit"))
				if err != nil || len(list) != 1 {
					t.Fatalf("call %d: ratelimit metadata %q: %v", i, md.Get("ratelimit"), err)
				}
				it := list[0].(httpsfv.Item)
				if r, _ := it.Params.Get("r"); it.Value != "checks" || r != int64(2-i) {
					t.Errorf("call %d: ratelimit = %q, want checks with r=%d", i, md.Get("ratelimit"), 2-i)
				}
			}
			md, err := check(ctx, c, nil)
			st := status.Convert(err)
			if st.Code() != codes.ResourceExhausted {
				t.Fatalf("call 3: %v, want RESOURCE_EXHAUSTED", err)
			}
			var retry *errdetails.RetryInfo
			var quota *errdetails.QuotaFailure
			for _, d := range st.Details() {
				switch d := d.(type) {
				case *errdetails.RetryInfo:
					retry = d
				case *errdetails.QuotaFailure:
					quota = d
				}
			}
			// 2 per minute: the next token comes 30 s after the first.
			if retry == nil || retry.GetRetryDelay().AsDuration() != 30*time.Second {
				t.Errorf("RetryInfo = %v, want a delay of 30s", retry)
			}
			if quota == nil || len(quota.Violations) != 1 || quota.Violations[0].Subject != "rule:health policy:checks" {
				t.Errorf("QuotaFailure = %v", quota)
			}
			if got := md.Get("retry-after"); len(got) != 1 || got[0] != "30" {
				t.Errorf("retry-after metadata = %q, want 30", got)
			}
			// Another method is not limited by this rule.
			if _, err := c.List(ctx, &healthpb.HealthListRequest{}); err != nil {
				t.Errorf("List: %v", err)
			}
		})
	}
}

func TestStream(t *testing.T) {
	t.Parallel()
	lim := mustNew(t, memorystore.New(), []grpclimit.Rule{{
		Name:     "watch",
		Method:   "/grpc.health.v1.Health/*",
		Key:      grpclimit.Metadata("x-api-key"),
		Policies: []enforce.Policy{{Name: "streams", Limit: tollgate.PerMinute(1)}},
	}})
	c := serve(t, lim)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func(key string) error {
		sctx := metadata.AppendToOutgoingContext(ctx, "x-api-key", key)
		s, err := c.Watch(sctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return err
		}
		_, err = s.Recv()
		return err
	}
	if err := open("tenant-a"); err != nil {
		t.Fatalf("first stream: %v", err)
	}
	if err := open("tenant-a"); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("second stream of tenant-a: %v, want RESOURCE_EXHAUSTED", err)
	}
	if err := open("tenant-b"); err != nil {
		t.Errorf("tenant-b, isolated from tenant-a: %v", err)
	}
}

// The peer's address is the key; forwarding metadata counts only from a
// trusted proxy, walking from the right.
func TestPeerAndSpoofing(t *testing.T) {
	t.Parallel()
	rules := []grpclimit.Rule{{Name: "ip", Policies: []enforce.Policy{{Name: "ip", Limit: tollgate.PerMinute(2)}}}}
	calls := func(c healthpb.HealthClient, xffs ...string) []codes.Code {
		var out []codes.Code
		for _, x := range xffs {
			_, err := check(context.Background(), c, metadata.Pairs("x-forwarded-for", x))
			out = append(out, status.Code(err))
		}
		return out
	}
	untrusted := serve(t, mustNew(t, memorystore.New(), rules))
	got := calls(untrusted, "198.51.100.1", "198.51.100.2", "198.51.100.3")
	if want := []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("untrusted peer: %v, want %v (spoofed metadata ignored)", got, want)
	}
	trusted := serve(t, mustNew(t, memorystore.New(), rules,
		enforce.WithClientIP(clientip.MustNew(clientip.TrustProxies("127.0.0.1")))))
	got = calls(trusted, "6.6.6.1, 203.0.113.7", "6.6.6.2, 203.0.113.7", "6.6.6.3, 203.0.113.7", "203.0.113.8")
	if want := []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted, codes.OK}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("trusted proxy: %v, want %v", got, want)
	}
}

// Redis killed: fail-closed answers UNAVAILABLE with RetryInfo, fail-open
// lets the call through.
func TestRedisStopped(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t)
	limit := []enforce.Policy{{Name: "p", Limit: tollgate.PerMinute(100)}}
	lim := mustNew(t, redisstore.New(srv.Client(t)), []grpclimit.Rule{
		{Name: "check", Method: "/grpc.health.v1.Health/Check", FailureMode: enforce.FailClosed, Policies: limit},
		{Name: "list", Method: "/grpc.health.v1.Health/List", FailureMode: enforce.FailOpen, Policies: limit},
	})
	c := serve(t, lim)
	ctx := context.Background()
	if _, err := check(ctx, c, nil); err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	_, err := check(ctx, c, nil)
	st := status.Convert(err)
	if st.Code() != codes.Unavailable || len(st.Details()) != 1 {
		t.Errorf("fail-closed with Redis down: %v (details %v), want UNAVAILABLE with RetryInfo", err, st.Details())
	}
	if _, err := c.List(ctx, &healthpb.HealthListRequest{}); err != nil {
		t.Errorf("fail-open with Redis down: %v", err)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	ok := []enforce.Policy{{Name: "p", Limit: tollgate.PerSecond(1)}}
	for _, rules := range [][]grpclimit.Rule{
		{{Name: "", Policies: ok}},
		{{Name: "a", Method: "pkg.Svc/M", Policies: ok}},
		{{Name: "a", Policies: ok}, {Name: "a", Policies: ok}},
		{{Name: "a", Key: grpclimit.Metadata(""), Policies: ok}},
		{{Name: "a"}},
	} {
		if _, err := grpclimit.New(memorystore.New(), rules); err == nil {
			t.Errorf("New(%+v) accepted it", rules)
		}
	}
}

// TestClock: x-ratelimit-reset, a Unix time, is read from WithClock's
// clock, as httplimit's X-RateLimit-Reset is.
func TestClock(t *testing.T) {
	t.Parallel()
	c := newClock()
	lim := mustNew(t, memorystore.New(memorystore.WithClock(c.Now)), []grpclimit.Rule{{
		Name:     "health",
		Policies: []enforce.Policy{{Name: "checks", Limit: tollgate.PerMinute(2)}},
	}}, enforce.WithHeaders(headers.XRateLimit), grpclimit.WithClock(c.Now))
	md, err := check(context.Background(), serve(t, lim), nil)
	if err != nil {
		t.Fatal(err)
	}
	reset, err := strconv.ParseInt(strings.Join(md.Get("x-ratelimit-reset"), ""), 10, 64)
	if err != nil {
		t.Fatalf("x-ratelimit-reset %q: %v", md.Get("x-ratelimit-reset"), err)
	}
	if got, lo, hi := reset, c.Now().Unix(), c.Now().Add(time.Minute).Unix(); got < lo || got > hi {
		t.Errorf("x-ratelimit-reset = %d, want between %d and %d (the clock's now and a minute later)", got, lo, hi)
	}
}
