package grpclimit_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/prometheus/client_golang/prometheus"
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

// generate is the handler of the test service: it reports each value of
// the request's "used" metadata as one "x-tokens-used" trailer, with
// setTrailer, and fails with the code in "code", if any.
func generate(ctx context.Context, setTrailer func(metadata.MD)) error {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("used") {
		setTrailer(metadata.Pairs("x-tokens-used", v, "x-other", "kept"))
	}
	if c := md.Get("code"); len(c) > 0 {
		n, _ := strconv.Atoi(c[0])
		return status.Error(codes.Code(n), "generation failed")
	}
	return nil
}

// genService returns a service of one unary and one server-streaming
// method, on the health protocol's messages, whose handlers call hook
// first, if set, then generate.
func genService(hook func()) *grpc.ServiceDesc {
	run := func(ctx context.Context, setTrailer func(metadata.MD)) error {
		if hook != nil {
			hook()
		}
		return generate(ctx, setTrailer)
	}
	return &grpc.ServiceDesc{
		ServiceName: "test.Gen",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Generate",
			Handler: func(srv any, ctx context.Context, dec func(any) error, icp grpc.UnaryServerInterceptor) (any, error) {
				in := new(healthpb.HealthCheckRequest)
				if err := dec(in); err != nil {
					return nil, err
				}
				h := func(ctx context.Context, _ any) (any, error) {
					if err := run(ctx, func(md metadata.MD) { _ = grpc.SetTrailer(ctx, md) }); err != nil {
						return nil, err
					}
					return &healthpb.HealthCheckResponse{}, nil
				}
				return icp(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/test.Gen/Generate"}, h)
			},
		}},
		Streams: []grpc.StreamDesc{{
			StreamName:    "Stream",
			ServerStreams: true,
			Handler: func(_ any, ss grpc.ServerStream) error {
				in := new(healthpb.HealthCheckRequest)
				if err := ss.RecvMsg(in); err != nil {
					return err
				}
				if err := ss.SendMsg(&healthpb.HealthCheckResponse{}); err != nil {
					return err
				}
				return run(ss.Context(), ss.SetTrailer)
			},
		}},
	}
}

var streamDesc = &grpc.StreamDesc{StreamName: "Stream", ServerStreams: true}

// serveGen starts the test service behind lim on loopback.
func serveGen(t *testing.T, lim *grpclimit.Limiter, hook func()) *grpc.ClientConn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(lim.StreamServerInterceptor()),
	)
	srv.RegisterService(genService(hook), nil)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// callGen calls the unary or the streaming method with md, and returns
// the header and trailer metadata and the status.
func callGen(conn *grpc.ClientConn, stream bool, md metadata.MD) (header, trailer metadata.MD, err error) {
	ctx := metadata.NewOutgoingContext(context.Background(), md)
	if !stream {
		err = conn.Invoke(ctx, "/test.Gen/Generate", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{},
			grpc.Header(&header), grpc.Trailer(&trailer))
		return header, trailer, err
	}
	cs, err := conn.NewStream(ctx, streamDesc, "/test.Gen/Stream")
	if err != nil {
		return nil, nil, err
	}
	if err := cs.SendMsg(&healthpb.HealthCheckRequest{}); err != nil {
		return nil, nil, err
	}
	if err := cs.CloseSend(); err != nil {
		return nil, nil, err
	}
	for {
		if err = cs.RecvMsg(&healthpb.HealthCheckResponse{}); err != nil {
			break
		}
	}
	if errors.Is(err, io.EOF) {
		err = nil
	}
	header, _ = cs.Header()
	return header, cs.Trailer(), err
}

// remainingOf returns r of policy in the ratelimit header metadata, or -1.
func remainingOf(t *testing.T, md metadata.MD, policy string) int64 {
	t.Helper()
	list, err := httpsfv.UnmarshalList(md.Get("ratelimit"))
	if err != nil {
		t.Fatalf("ratelimit metadata %q: %v", md.Get("ratelimit"), err)
	}
	for _, m := range list {
		if it, ok := m.(httpsfv.Item); ok && it.Value == policy {
			r, _ := it.Params.Get("r")
			return r.(int64)
		}
	}
	return -1
}

// genRule reserves an estimate of 4 under a token bucket of 10 a minute.
func genRule(s *grpclimit.Settle) grpclimit.Rule {
	return grpclimit.Rule{
		Name:     "llm",
		Method:   "/test.Gen/*",
		Policies: []enforce.Policy{{Name: "tokens", Limit: tollgate.PerMinute(10)}},
		Cost:     func(context.Context, string) int { return 4 },
		Settle:   s,
	}
}

// TestSettle: the real cost a call reports in its trailer, or a refund by
// status code, replaces the estimate of 4, as the next call sees it; unary
// and streaming, on both stores.
func TestSettle(t *testing.T) {
	t.Parallel()
	trailer := &grpclimit.Settle{Trailer: "x-tokens-used", Refund: grpclimit.ServerError}
	hidden := &grpclimit.Settle{Trailer: "X-Tokens-Used", Hide: true}
	for _, tc := range []struct {
		name   string
		settle *grpclimit.Settle
		md     metadata.MD
		want   int64  // remaining of 10 after the first call settled
		client string // x-tokens-used as the client gets it
		bad    float64
	}{
		{"no trailer: the estimate stands", trailer, nil, 6, "", 0},
		{"less than the estimate", trailer, metadata.Pairs("used", "1"), 9, "1", 0},
		{"more than the estimate", trailer, metadata.Pairs("used", "6"), 4, "6", 0},
		{"a refund on INTERNAL", trailer, metadata.Pairs("used", "7", "code", strconv.Itoa(int(codes.Internal))), 10, "7", 0},
		{"no refund on INVALID_ARGUMENT", trailer, metadata.Pairs("code", strconv.Itoa(int(codes.InvalidArgument))), 6, "", 0},
		{"not a number", trailer, metadata.Pairs("used", "many"), 6, "many", 1},
		{"several values", trailer, metadata.Pairs("used", "1", "used", "2"), 6, "1,2", 1},
		{"hidden", hidden, metadata.Pairs("used", "2"), 8, "", 0},
		{"a func of the code and trailer", &grpclimit.Settle{Func: func(code codes.Code, md metadata.MD) (int, bool) {
			n, err := strconv.Atoi(strings.Join(md.Get("x-tokens-used"), ""))
			return n + 1, err == nil && code == codes.OK
		}}, metadata.Pairs("used", "2"), 7, "2", 0},
	} {
		for _, stream := range []bool{false, true} {
			name := tc.name + "/unary"
			if stream {
				name = tc.name + "/stream"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				for _, b := range testkit.Stores(server.Client) {
					t.Run(b.Name, func(t *testing.T) {
						reg := prometheus.NewRegistry()
						lim := mustNew(t, b.New(t, newClock().Now), []grpclimit.Rule{genRule(tc.settle)},
							enforce.WithRegistry(reg), enforce.WithLogger(slog.New(&testkit.Logs{})))
						conn := serveGen(t, lim, nil)
						header, tr, _ := callGen(conn, stream, tc.md)
						if got := remainingOf(t, header, "tokens"); got != 6 {
							t.Errorf("ratelimit r = %d, want 6: the reservation's", got)
						}
						if got := strings.Join(tr.Get("x-tokens-used"), ","); got != tc.client {
							t.Errorf("client's x-tokens-used trailer = %q, want %q", got, tc.client)
						}
						if tc.md.Get("used") != nil && strings.Join(tr.Get("x-other"), ",") == "" {
							t.Errorf("client's trailer %v lost x-other", tr)
						}
						if err := lim.Drain(context.Background()); err != nil {
							t.Fatal(err)
						}
						header, _, err := callGen(conn, stream, nil)
						if err != nil {
							t.Fatal(err)
						}
						if got := remainingOf(t, header, "tokens") + 4; got != tc.want {
							t.Errorf("remaining after the settle = %d, want %d", got, tc.want)
						}
						if got := counterOf(t, reg, "tollgate_grpc_bad_costs_total"); got != tc.bad {
							t.Errorf("bad_costs_total = %v, want %v", got, tc.bad)
						}
					})
				}
			})
		}
	}
}

// counterOf returns the value of the one series of the counter name in
// reg.
func counterOf(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no single series %s", name)
	return 0
}

// TestSettleDebt: a call that cost more than the key had left puts it in
// debt, which its next calls wait out.
func TestSettleDebt(t *testing.T) {
	t.Parallel()
	for _, b := range testkit.Stores(server.Client) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			c := newClock()
			rule := genRule(&grpclimit.Settle{Trailer: "x-tokens-used"})
			rule.Cost = nil // 1
			lim := mustNew(t, b.New(t, c.Now), []grpclimit.Rule{rule})
			conn := serveGen(t, lim, nil)
			if _, _, err := callGen(conn, false, metadata.Pairs("used", "15")); err != nil {
				t.Fatal(err)
			}
			if err := lim.Drain(context.Background()); err != nil {
				t.Fatal(err)
			}
			// 10 − 15 = −5 tokens: one more is 6 tokens, 36 s, away.
			for _, step := range []struct {
				advance time.Duration
				want    codes.Code
			}{{0, codes.ResourceExhausted}, {35 * time.Second, codes.ResourceExhausted}, {time.Second, codes.OK}} {
				c.Advance(step.advance)
				if _, _, err := callGen(conn, false, nil); status.Code(err) != step.want {
					t.Fatalf("after %v more: %v, want %v", step.advance, err, step.want)
				}
			}
		})
	}
}

// TestSettleNeedsSettler: a rule that settles on a store that cannot is
// refused at New.
func TestSettleNeedsSettler(t *testing.T) {
	t.Parallel()
	type plainStore struct{ tollgate.Store }
	for _, tc := range []struct {
		name   string
		store  tollgate.Store
		settle *grpclimit.Settle
		want   string
	}{
		{"not a Settler", plainStore{memorystore.New()}, &grpclimit.Settle{Trailer: "x-tokens-used"}, "cannot settle"},
		{"empty", memorystore.New(), &grpclimit.Settle{}, "needs a Trailer, a Func or a Refund"},
		{"hide without trailer", memorystore.New(), &grpclimit.Settle{Refund: grpclimit.ServerError, Hide: true}, "Hide"},
		{"reserved key", memorystore.New(), &grpclimit.Settle{Trailer: "grpc-status"}, "not a metadata key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := grpclimit.New(tc.store, []grpclimit.Rule{genRule(tc.settle)})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "grpclimit: ") {
				t.Errorf("New: %v, want a grpclimit error saying %q", err, tc.want)
			}
		})
	}
}

// TestSettleStoreFails: Redis stops, or hangs, while the handler runs,
// after the reservation: the call's answer is the handler's, and the
// failed settle is counted in store_errors_total and logged; the estimate
// stands.
func TestSettleStoreFails(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		fail func(*redistest.Server) error
	}{
		{"stopped", (*redistest.Server).Stop},
		{"paused", (*redistest.Server).Pause},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.NewServer(t)
			t.Cleanup(func() { _ = srv.Resume() })
			reg := prometheus.NewRegistry()
			logs := &testkit.Logs{}
			lim := mustNew(t, redisstore.New(srv.Client(t)), []grpclimit.Rule{genRule(&grpclimit.Settle{Trailer: "x-tokens-used"})},
				enforce.WithTimeout(3*time.Second), enforce.WithRegistry(reg), enforce.WithLogger(slog.New(logs)))
			conn := serveGen(t, lim, func() {
				if err := tc.fail(srv); err != nil {
					t.Error(err)
				}
			})
			header, tr, err := callGen(conn, false, metadata.Pairs("used", "1"))
			if err != nil {
				t.Fatalf("call: %v, want the handler's OK", err)
			}
			if got := remainingOf(t, header, "tokens"); got != 6 {
				t.Errorf("ratelimit r = %d, want 6", got)
			}
			if got := tr.Get("x-tokens-used"); len(got) != 1 || got[0] != "1" {
				t.Errorf("trailer x-tokens-used = %q, want the handler's", got)
			}
			if tc.name == "paused" {
				// The settle waits for the paused Redis until its deadline,
				// seconds away: the response did not wait for it.
				done, cancel := context.WithCancel(context.Background())
				cancel()
				if err := lim.Drain(done); err == nil {
					t.Error("the settle was over when the response returned: the response waited for it")
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := lim.Drain(ctx); err != nil {
				t.Fatalf("the settle did not give up: %v", err)
			}
			if got := counterOf(t, reg, "tollgate_grpc_store_errors_total"); got != 1 {
				t.Errorf("store_errors_total = %v, want 1", got)
			}
			recs := logs.Attrs()
			if len(recs) != 1 || recs[0]["outcome"] != "estimate_stands" {
				t.Errorf("log records = %v, want one with outcome estimate_stands", recs)
			}
		})
	}
}
