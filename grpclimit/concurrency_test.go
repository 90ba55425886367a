package grpclimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/grpclimit"
	"github.com/tollgate/tollgate/internal/test/redistest"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
)

// healthService is a health service whose Check and Watch run what a test
// says: a slow handler, a panicking one, a stream held open.
type healthService struct {
	healthpb.UnimplementedHealthServer
	check func(ctx context.Context) error
	watch func(stream healthpb.Health_WatchServer) error
}

func (s *healthService) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if s.check != nil {
		if err := s.check(ctx); err != nil {
			return nil, err
		}
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (s *healthService) List(context.Context, *healthpb.HealthListRequest) (*healthpb.HealthListResponse, error) {
	return &healthpb.HealthListResponse{}, nil
}

func (s *healthService) Watch(_ *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	return s.watch(stream)
}

// recoverPanics turns a handler's panic into INTERNAL, as a recovery
// interceptor outside the limiter would, so that the server lives on.
func recoverPanics(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = status.Errorf(codes.Internal, "panic: %v", v)
		}
	}()
	return handler(ctx, req)
}

// serveConc starts a real gRPC server on loopback with svc behind conc's
// interceptors (and a panic recovery outside them), and returns a client.
func serveConc(t *testing.T, conc *grpclimit.Limiter, svc *healthService) healthpb.HealthClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(recoverPanics, conc.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(conc.StreamServerInterceptor()),
	)
	healthpb.RegisterHealthServer(srv, svc)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// mustConcurrency makes a ConcurrencyLimiter with a generous store
// deadline (see mustNew) unless opts set one.
func mustConcurrency(t *testing.T, store tollgate.ConcurrencyStore, rule grpclimit.ConcurrencyRule, opts ...enforce.Option) *grpclimit.Limiter {
	t.Helper()
	opts = append([]enforce.Option{enforce.WithTimeout(10 * time.Second)}, opts...)
	c, err := grpclimit.Concurrency(store, rule, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// byTenant keys calls by their x-tenant metadata; a call without one is
// not limited.
func byTenant(ctx context.Context, _ string) (string, bool) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-tenant"); len(v) > 0 && v[0] != "" {
		return v[0], true
	}
	return "", false
}

func asTenant(ctx context.Context, tenant string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "x-tenant", tenant)
}

// permits returns how many permits Redis holds for key under st: live or
// lapsed, every permit not released.
func permits(t *testing.T, st *redisstore.Store, key string) int64 {
	t.Helper()
	n, err := server.Client(t).ZCard(context.Background(), st.ConcurrencyKey(key)).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func retryInfo(err error) *errdetails.RetryInfo {
	for _, d := range status.Convert(err).Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			return r
		}
	}
	return nil
}

// Two replicas, each a gRPC server with its own redisstore.Store on one
// Redis, share one limit of 3 per tenant. First 10 calls on both replicas
// against handlers that wait: 3 run, 7 fail with RESOURCE_EXHAUSTED and a
// RetryInfo. Then 8 clients make 5 calls each, retrying denials, against
// short handlers: never more than 3 run at once, and every permit is given
// back at the end.
func TestConcurrencyTwoReplicas(t *testing.T) {
	t.Parallel()
	const max = 3
	prefix := testkit.KeyPrefix(t)
	var flight testkit.InFlight
	gate := make(chan struct{})
	var slow atomic.Bool
	slow.Store(true)
	svc := &healthService{check: func(ctx context.Context) error {
		flight.Enter()
		defer flight.Leave()
		if slow.Load() {
			<-gate
		} else {
			time.Sleep(time.Millisecond)
		}
		return nil
	}}
	var stores []*redisstore.Store
	var clients []healthpb.HealthClient
	for range 2 {
		st := redisstore.New(server.Client(t), redisstore.WithPrefix(prefix))
		stores = append(stores, st)
		conc := mustConcurrency(t, st, grpclimit.ConcurrencyRule{Name: "export", Method: "/grpc.health.v1.Health/Check", Key: byTenant, Max: max})
		clients = append(clients, serveConc(t, conc, svc))
	}
	ctx := asTenant(context.Background(), "acme")

	errs := make(chan error, 10)
	for i := range 10 {
		go func() {
			_, err := clients[i%2].Check(ctx, &healthpb.HealthCheckRequest{})
			errs <- err
		}()
	}
	var denied []error
	for range 10 - max {
		if err := <-errs; err != nil {
			denied = append(denied, err)
		}
	}
	testkit.Eventually(t, "3 calls in flight", func() bool { return flight.Now() == max })
	close(gate)
	for range max {
		if err := <-errs; err != nil {
			denied = append(denied, err)
		}
	}
	if got, want := len(denied), 10-max; got != want {
		t.Errorf("%d of 10 calls denied, want %d", got, want)
	}
	for _, err := range denied {
		if got, want := status.Code(err), codes.ResourceExhausted; got != want {
			t.Errorf("denied call: %v, want %v", err, want)
		}
		if r := retryInfo(err); r == nil || r.GetRetryDelay().AsDuration() <= 0 || r.GetRetryDelay().AsDuration() > 30*time.Second { // the default lease
			t.Errorf("denied call's RetryInfo = %v, want a delay within a lease", r)
		}
	}
	if got, want := flight.Peak(), int64(max); got != want {
		t.Errorf("first round: peak %d in flight, want %d", got, want)
	}

	slow.Store(false)
	flight.ResetPeak()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range 8 {
		wg.Go(func() {
			for done := 0; done < 5; {
				_, err := clients[i%2].Check(ctx, &healthpb.HealthCheckRequest{})
				switch status.Code(err) {
				case codes.OK:
					done++
				case codes.ResourceExhausted:
					time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
				default:
					failed.Add(1)
					return
				}
			}
		})
	}
	wg.Wait()
	if got := failed.Load(); got != 0 {
		t.Errorf("%d clients failed with an error other than RESOURCE_EXHAUSTED", got)
	}
	if got := flight.Peak(); got > max || got < 1 {
		t.Errorf("second round: peak %d in flight, want 1 to %d", got, max)
	}
	for i, st := range stores {
		if got, want := permits(t, st, "export:acme"), int64(0); got != want {
			t.Errorf("replica %d: %d permits after every call, want %d", i, got, want)
		}
	}
}

// A handler that panics gives its slot back as one that returns does.
func TestConcurrencyPanicReleases(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		panic bool
		code  codes.Code
	}{
		{"returns", false, codes.OK},
		{"panics", true, codes.Internal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := redisstore.New(server.Client(t), redisstore.WithPrefix(testkit.KeyPrefix(t)))
			conc := mustConcurrency(t, st, grpclimit.ConcurrencyRule{Name: "export", Key: byTenant, Max: 1})
			var first atomic.Bool
			first.Store(true)
			c := serveConc(t, conc, &healthService{check: func(context.Context) error {
				if tc.panic && first.CompareAndSwap(true, false) {
					panic("boom")
				}
				return nil
			}})
			ctx := asTenant(context.Background(), "acme")
			_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
			if got, want := status.Code(err), tc.code; got != want {
				t.Errorf("first call: %v, want %v", err, want)
			}
			if got, want := permits(t, st, "export:acme"), int64(0); got != want {
				t.Errorf("%d permits after the handler, want %d", got, want)
			}
			if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
				t.Errorf("the next call: %v, want OK", err)
			}
		})
	}
}

// A stream holds its slot for its whole life: past its first lease (kept
// by renewals) a unary call and a second stream of the same tenant are
// denied, another tenant and a method outside the rule are not. When the
// client ends the stream, the slot is free.
func TestConcurrencyStream(t *testing.T) {
	t.Parallel()
	const lease = time.Second // renewals every 500 ms: late only on a machine stalled that long
	st := &testkit.RenewCounter{ConcurrencyStore: redisstore.New(server.Client(t), redisstore.WithPrefix(testkit.KeyPrefix(t)))}
	conc := mustConcurrency(t, st, grpclimit.ConcurrencyRule{
		Name: "watch", Key: byTenant, Max: 1, Lease: lease,
		Method: "/grpc.health.v1.Health/*",
		Match:  func(_ context.Context, m string) bool { return m != "/grpc.health.v1.Health/List" },
	})
	c := serveConc(t, conc, &healthService{watch: func(stream healthpb.Health_WatchServer) error {
		if err := stream.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}); err != nil {
			return err
		}
		<-stream.Context().Done()
		return nil
	}})
	open := func(ctx context.Context) error {
		s, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return err
		}
		_, err = s.Recv()
		return err
	}
	ctx, cancel := context.WithCancel(asTenant(context.Background(), "acme"))
	defer cancel()
	if err := open(ctx); err != nil {
		t.Fatalf("first stream: %v", err)
	}
	start := time.Now()
	testkit.Eventually(t, "3 renewals", func() bool { return st.Renewals.Load() >= 3 })
	if elapsed := time.Since(start); elapsed < lease {
		t.Errorf("3 renewals after %v, before the first lease ended", elapsed)
	}
	acme := asTenant(context.Background(), "acme")
	if _, err := c.Check(acme, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a unary call while the stream is open: %v, want RESOURCE_EXHAUSTED", err)
	}
	sctx, scancel := context.WithCancel(acme)
	if err := open(sctx); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a second stream: %v, want RESOURCE_EXHAUSTED", err)
	}
	scancel()
	if _, err := c.Check(asTenant(context.Background(), "other"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("another tenant: %v, want OK", err)
	}
	if _, err := c.List(acme, &healthpb.HealthListRequest{}); err != nil {
		t.Errorf("List, outside the rule: %v, want OK", err)
	}
	if _, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("a call without a tenant: %v, want OK", err)
	}
	if got := st.Failures.Load(); got != 0 {
		t.Errorf("%d renewals failed", got)
	}
	cancel()
	testkit.Eventually(t, "the stream's permit released", func() bool { return permits(t, st.ConcurrencyStore.(*redisstore.Store), "watch:acme") == 0 })
	n := st.Renewals.Load()
	if _, err := c.Check(acme, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("a call after the stream ended: %v, want OK", err)
	}
	time.Sleep(2 * lease) // would hold 4 renewals if they went on
	if got := st.Renewals.Load(); got != n {
		t.Errorf("%d renewals after the stream ended, want none", got-n)
	}
}

// With Redis stopped, a fail-open rule runs the handler without a slot and
// a fail-closed rule fails the call with UNAVAILABLE and a RetryInfo.
func TestConcurrencyRedisStopped(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t)
	st := redisstore.New(srv.Client(t))
	var ran atomic.Int64
	svc := &healthService{check: func(context.Context) error { ran.Add(1); return nil }}
	clients := map[enforce.FailureMode]healthpb.HealthClient{}
	logs := &testkit.Logs{}
	for _, mode := range []enforce.FailureMode{enforce.FailOpen, enforce.FailClosed} {
		conc := mustConcurrency(t, st, grpclimit.ConcurrencyRule{Name: "export-" + mode.String(), Key: byTenant, Max: 1, FailureMode: mode},
			enforce.WithTimeout(time.Second), enforce.WithFailClosedRetryAfter(2*time.Second),
			enforce.WithLogger(slog.New(logs)), enforce.WithLogInterval(time.Hour))
		clients[mode] = serveConc(t, conc, svc)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mode  enforce.FailureMode
		code  codes.Code
		retry time.Duration // 0: no RetryInfo
		ran   int64         // handler runs after the three calls
	}{
		{enforce.FailOpen, codes.OK, 0, 3},
		{enforce.FailClosed, codes.Unavailable, 2 * time.Second, 3},
	} {
		for range 3 {
			_, err := clients[tc.mode].Check(asTenant(context.Background(), "acme"), &healthpb.HealthCheckRequest{})
			if got, want := status.Code(err), tc.code; got != want {
				t.Errorf("%v with Redis down: %v, want %v", tc.mode, err, want)
			}
			var got time.Duration
			if r := retryInfo(err); r != nil {
				got = r.GetRetryDelay().AsDuration()
			}
			if want := tc.retry; got != want {
				t.Errorf("%v with Redis down: RetryInfo delay %v, want %v", tc.mode, got, want)
			}
		}
		if got, want := ran.Load(), tc.ran; got != want {
			t.Errorf("after %v: the handler ran %d times, want %d", tc.mode, got, want)
		}
	}
	got := map[string]string{}
	for _, r := range logs.Attrs() {
		got[r["rule"]] += r["call"] + " " + r["outcome"] + ";"
	}
	want := map[string]string{"export-fail_open": "acquire fail_open;", "export-fail_closed": "acquire fail_closed;"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("log records %v, want one per rule for its three failures: %v", got, want)
	}
}

func TestConcurrencyInvalidRule(t *testing.T) {
	t.Parallel()
	ok := grpclimit.ConcurrencyRule{Name: "export", Key: byTenant, Max: 1}
	for _, tc := range []struct {
		name   string
		change func(r *grpclimit.ConcurrencyRule)
		is     error // nil: any error
	}{
		{"no name", func(r *grpclimit.ConcurrencyRule) { r.Name = "" }, nil},
		{"colon in name", func(r *grpclimit.ConcurrencyRule) { r.Name = "a:b" }, nil},
		{"no key", func(r *grpclimit.ConcurrencyRule) { r.Key = nil }, nil},
		{"max 0", func(r *grpclimit.ConcurrencyRule) { r.Max = 0 }, tollgate.ErrInvalidLimit},
		{"max too large", func(r *grpclimit.ConcurrencyRule) { r.Max = tollgate.MaxConcurrency + 1 }, tollgate.ErrInvalidLimit},
		{"lease too long", func(r *grpclimit.ConcurrencyRule) { r.Lease = tollgate.MaxLease + time.Second }, tollgate.ErrInvalidLimit},
		{"method without /", func(r *grpclimit.ConcurrencyRule) { r.Method = "pkg.Service/M" }, nil},
		{"unknown failure mode", func(r *grpclimit.ConcurrencyRule) { r.FailureMode = 9 }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ok
			tc.change(&r)
			_, err := grpclimit.Concurrency(memorystore.New(), r)
			if err == nil {
				t.Fatal("no error")
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %v, want %v", err, tc.is)
			}
			if got, want := fmt.Sprint(err)[:len("grpclimit: ")], "grpclimit: "; got != want {
				t.Errorf("error %q does not start with %q", err, want)
			}
		})
	}
	if _, err := grpclimit.Concurrency(nil, ok); err == nil {
		t.Error("nil store: no error")
	}
	if _, err := grpclimit.Concurrency(memorystore.New(), ok); err != nil {
		t.Errorf("a valid rule: %v", err)
	}
}

// Redis stops while a stream holds a slot: its renewals fail and are
// logged, the stream still completes, and the failed release is logged.
func TestConcurrencyRenewalFails(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t)
	st := redisstore.New(srv.Client(t))
	logs := &testkit.Logs{}
	calls := func() string {
		var s []string
		for _, r := range logs.Attrs() {
			s = append(s, r["call"])
		}
		return strings.Join(s, ",")
	}
	conc := mustConcurrency(t, st, grpclimit.ConcurrencyRule{Name: "watch", Key: byTenant, Max: 1, Lease: 200 * time.Millisecond},
		enforce.WithTimeout(time.Second), enforce.WithLogger(slog.New(logs)), enforce.WithLogInterval(time.Hour))
	c := serveConc(t, conc, &healthService{watch: func(stream healthpb.Health_WatchServer) error {
		if err := srv.Stop(); err != nil {
			t.Error(err)
		}
		testkit.Eventually(t, "a failed renewal logged", func() bool { return calls() != "" })
		return stream.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
	}})
	s, err := c.Watch(asTenant(context.Background(), "acme"), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Errorf("stream whose renewals failed: %v, want its message", err)
	}
	if _, err := s.Recv(); err != io.EOF {
		t.Errorf("stream whose renewals failed: %v at its end, want io.EOF", err)
	}
	testkit.Eventually(t, "the failed release logged", func() bool { return calls() == "renew,release" })
}
