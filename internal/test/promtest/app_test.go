//go:build linux

package promtest_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/grpclimit"
	"github.com/tollgate/tollgate/httplimit"
	"github.com/tollgate/tollgate/redisstore"
	"github.com/tollgate/tollgate/tiered"
	"github.com/tollgate/tollgate/tiered/tieredprom"
)

// app is a program limited by tollgate's middleware, as a user of the
// library runs one: an HTTP API behind httplimit and a gRPC health service
// behind grpclimit, over a tiered store in front of Redis, with their
// metrics and the tier's on the HTTP listener's /metrics.
type app struct {
	http, grpc string
}

// shaper drains 50 requests a second: a request arriving in the queue
// waits its turn, up to half a second.
var shaper = tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 50, Period: time.Second, Burst: 1, MaxDelay: 500 * time.Millisecond}

// twentyPerSecond admits bursts of 10.
var twentyPerSecond = tollgate.Limit{Rate: 20, Period: time.Second, Burst: 10}

// tighter rolls fifteen a second out to half the keys, tried in shadow on
// the others: the rollout panels' arms.
var tighter = &enforce.Rollout{Limit: tollgate.Limit{Rate: 15, Period: time.Second, Burst: 10}, Percent: 50, Shadow: true}

func startApp(t *testing.T, redisAddr string) app {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	quiet := slog.New(slog.DiscardHandler)
	store := tiered.New(redisstore.New(rdb), tiered.WithTimeout(50*time.Millisecond),
		tiered.WithBreaker(3, 500*time.Millisecond), tiered.WithInstances(2), tiered.WithLogger(quiet))
	reg := prometheus.NewRegistry()
	if err := tieredprom.Register(reg, store, "app"); err != nil {
		t.Fatal(err)
	}
	opts := []enforce.Option{enforce.WithRegistry(reg), enforce.WithLogger(quiet), enforce.WithTimeout(time.Second)}
	hl, err := httplimit.New(store, []httplimit.Rule{
		{Name: "api", Pattern: "/api/", Policies: []enforce.Policy{{Name: "api", Limit: twentyPerSecond, Rollout: tighter}}},
		{Name: "api-next", Pattern: "/api/", DryRun: true, Policies: []enforce.Policy{{Name: "next", Limit: tollgate.PerSecond(10)}}},
		{Name: "shaped", Pattern: "/shaped/", Policies: []enforce.Policy{{Name: "drain", Limit: shaper}}},
	}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	gl, err := grpclimit.New(store, []grpclimit.Rule{
		{Name: "check", Method: "/grpc.health.v1.Health/Check", Policies: []enforce.Policy{{Name: "check", Limit: twentyPerSecond, Rollout: tighter}}},
		{Name: "list", Method: "/grpc.health.v1.Health/List", Policies: []enforce.Policy{{Name: "drain", Limit: shaper}}},
	}, opts...)
	if err != nil {
		t.Fatal(err)
	}

	api := http.NewServeMux()
	api.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	root := http.NewServeMux()
	root.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{})) // not limited
	root.Handle("/", hl.Handler(api))
	hln := listen(t)
	hs := &http.Server{Handler: root, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(hln) }()
	t.Cleanup(func() { _ = hs.Close() })

	gln := listen(t)
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(gl.UnaryServerInterceptor()), grpc.ChainStreamInterceptor(gl.StreamServerInterceptor()))
	hc := health.NewServer()
	hc.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hc)
	go func() { _ = gs.Serve(gln) }()
	t.Cleanup(gs.Stop)
	return app{http: hln.Addr().String(), grpc: gln.Addr().String()}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// load sends requests until ctx ends: to the decision service (/json and
// gRPC; over the limit, a fail-closed rule, descriptors no rule matches, an
// unknown domain) and to the app (admitted, shaped and denied, over HTTP
// and gRPC), each stream of them paced at a few hundred a second at most.
// A request that gets no answer at all fails the test.
func load(ctx context.Context, t *testing.T, serve proc, a app) {
	t.Helper()
	serveRLS := pb.NewRateLimitServiceClient(dial(t, serve.grpc))
	health := healthpb.NewHealthClient(dial(t, a.grpc))
	edge := `{"domain":"edge","descriptors":[` +
		`{"entries":[{"key":"remote_address","value":"10.0.0.1"}]},` +
		`{"entries":[{"key":"path","value":"/login"}]},` +
		`{"entries":[{"key":"no_such_key","value":"x"}]}]}`
	unknown := `{"domain":"edgee","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}`
	loops := []struct {
		every time.Duration
		do    func(context.Context) error
	}{
		{5 * time.Millisecond, func(ctx context.Context) error { return post(ctx, "http://"+serve.http+"/json", edge) }},
		{100 * time.Millisecond, func(ctx context.Context) error { return post(ctx, "http://"+serve.http+"/json", unknown) }},
		{10 * time.Millisecond, func(ctx context.Context) error {
			_, err := serveRLS.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{
				{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.2"}}}}})
			return err
		}},
		{5 * time.Millisecond, func(ctx context.Context) error { return get(ctx, "http://"+a.http+"/api/items") }},
		{10 * time.Millisecond, func(ctx context.Context) error { return get(ctx, "http://"+a.http+"/shaped/hook") }},
		{5 * time.Millisecond, func(ctx context.Context) error {
			_, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
			return grpcAnswered(err)
		}},
		{10 * time.Millisecond, func(ctx context.Context) error {
			_, err := health.List(ctx, &healthpb.HealthListRequest{})
			return grpcAnswered(err)
		}},
	}
	var wg sync.WaitGroup
	errs := make([]error, len(loops))
	for i, l := range loops {
		wg.Go(func() {
			tick := time.NewTicker(l.every)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				call, cancel := context.WithTimeout(ctx, 2*time.Second)
				if err := l.do(call); err != nil && !over(ctx) && errs[i] == nil {
					errs[i] = err
				}
				cancel()
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Errorf("load: %v", err)
		}
	}
}

// over reports whether ctx's load has ended: its deadline has passed even
// when the timer that cancels it has not run yet. (A call made then fails
// with DeadlineExceeded at once, for gRPC reads the deadline, not Err; on a
// busy machine the timer can run a while after.)
func over(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ctx.Err() != nil || ok && !time.Now().Before(dl)
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// grpcAnswered is err unless it is an answer of the limiter: denied,
// unavailable, or a shaped call that could not wait.
func grpcAnswered(err error) error {
	if err == nil || strings.Contains(err.Error(), "grpclimit") || strings.Contains(err.Error(), "deadline") {
		return nil
	}
	return err
}

func get(ctx context.Context, url string) error { return send(ctx, "GET", url, "") }

func post(ctx context.Context, url, body string) error { return send(ctx, "POST", url, body) }

// send sends one request; any status is an answer.
func send(ctx context.Context, method, url, body string) error {
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, url, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}
