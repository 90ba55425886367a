// Command serveload measures a rate-limit service that speaks Envoy's
// protocol — tollgate serve, or envoyproxy/ratelimit itself, side by side:
// decisions per second and latency percentiles, over gRPC with a fixed
// number of requests in flight, or over HTTP /json with vegeta.
//
//	serveload grpc --addr 127.0.0.1:8081 --inflight 64 --values 10000 --duration 10s [--pid PID]
//	serveload json --url http://127.0.0.1:8080/json --inflight 64 --values 10000 --duration 10s [--pid PID]
//
// Every request carries one descriptor, (key, value) with the value drawn
// at random from --values distinct ones, in --domain. With --pid, the
// service's CPU time (user + system, from /proc) over the run is divided by
// the decisions made: its own CPU per decision; the load generator's own is
// measured alike, and with --store-pid the store's (redis-server) too. The
// load generator runs on
// the same machine and competes for its cores: compare services measured in
// the same run, not figures from different machines. For that reason the
// gRPC mode's calls are made by a client of its own (h2conn: HTTP/2 frames
// written and read directly, requests encoded once, only overall_code
// read), which costs a call a third of what grpc-go's client does;
// --client grpc-go uses grpc-go's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	vegeta "github.com/tsenart/vegeta/v12/lib"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

type options struct {
	domain   string
	key      string
	values   int
	inflight int
	duration time.Duration
	warmup   time.Duration
	pid      int
	storePID int
	conns    int
	label    string
	tsv      string
	profile  string
	client   string
}

func main() {
	if len(os.Args) >= 2 && os.Args[1] == "ask" {
		os.Exit(ask(os.Args[2:]))
	}
	if len(os.Args) < 2 || (os.Args[1] != "grpc" && os.Args[1] != "json") {
		fmt.Fprintln(os.Stderr, "usage: serveload grpc|json|ask [flags] (serveload grpc -h for the flags)")
		os.Exit(2)
	}
	mode := os.Args[1]
	fs := flag.NewFlagSet("serveload "+mode, flag.ExitOnError)
	var o options
	addr := fs.String("addr", "127.0.0.1:8081", "gRPC address (grpc)")
	url := fs.String("url", "http://127.0.0.1:8080/json", "/json URL (json)")
	fs.StringVar(&o.domain, "domain", "bench", "domain of every request")
	fs.StringVar(&o.key, "key", "client", "descriptor key")
	fs.IntVar(&o.values, "values", 10000, "distinct descriptor values")
	fs.IntVar(&o.inflight, "inflight", 64, "requests in flight")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long to measure")
	fs.DurationVar(&o.warmup, "warmup", 2*time.Second, "load before measuring (connections, caches, scripts)")
	fs.IntVar(&o.pid, "pid", 0, "the service's process id, to measure its CPU per decision")
	fs.IntVar(&o.storePID, "store-pid", 0, "the store's process id (redis-server), to measure its CPU per decision")
	fs.IntVar(&o.conns, "conns", 1, "gRPC connections (Envoy uses one per worker thread)")
	fs.StringVar(&o.label, "label", "", "a name for the result line")
	fs.StringVar(&o.tsv, "tsv", "", "also append the result to this file as one tab-separated line: label, mode, decisions/s, p50 µs, p99 µs, then CPU µs/decision of the service, the load generator and the store, each empty when not measured (compare.sh adds up its rounds from it)")
	fs.StringVar(&o.client, "client", "lean", "gRPC client: lean (HTTP/2 frames written and read directly, the least CPU a call) or grpc-go (grpc-go's client)")
	fs.StringVar(&o.profile, "cpuprofile", "", "write the load generator's own CPU profile of the measured run to this file")
	fs.Parse(os.Args[2:])
	var (
		res result
		err error
	)
	if mode == "grpc" {
		res, err = runGRPC(*addr, o)
	} else {
		res, err = runJSON(*url, o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "serveload:", err)
		os.Exit(1)
	}
	res.print(mode, o)
	if o.tsv != "" {
		if err := res.appendTSV(o.tsv, mode, o); err != nil {
			fmt.Fprintln(os.Stderr, "serveload:", err)
			os.Exit(1)
		}
	}
}

type result struct {
	decisions  int
	errors     int
	overLimit  int
	elapsed    time.Duration
	p50, p99   time.Duration
	p999       time.Duration
	cpu        [nprocs]time.Duration // each process's CPU during the measured run
	cpuKnown   [nprocs]bool
	firstError string
}

// The processes whose CPU time a run measures, as indexes of result.cpu.
const (
	procService = iota // the service (--pid)
	procLoad           // the load generator itself
	procStore          // the store behind the service (--store-pid)
	nprocs
)

// perDecision returns process p's CPU per decision in microseconds, and
// whether it was measured.
func (r result) perDecision(p int) (float64, bool) {
	if !r.cpuKnown[p] || r.decisions == 0 {
		return 0, false
	}
	return float64(r.cpu[p].Microseconds()) / float64(r.decisions), true
}

func (r result) print(mode string, o options) {
	label := o.label
	if label == "" {
		label = mode
	}
	rate := float64(r.decisions) / r.elapsed.Seconds()
	fmt.Printf("%s: %d decisions in %.1fs = %.0f decisions/s; p50 %v p99 %v p99.9 %v; %d in flight over %d values; over_limit %d; errors %d",
		label, r.decisions, r.elapsed.Seconds(), rate, r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.p999.Round(time.Microsecond),
		o.inflight, o.values, r.overLimit, r.errors)
	// Besides the service's own, what its rivals for the same cores spend:
	// the load generator's and the store's shares bound the ratio of two
	// services' decisions/s.
	for p, name := range [nprocs]string{"service", "load generator", "store"} {
		if us, ok := r.perDecision(p); ok {
			fmt.Printf("; %s CPU %.1f µs/decision", name, us)
		}
	}
	fmt.Println()
	if r.firstError != "" {
		fmt.Println("  first error:", r.firstError)
	}
}

// appendTSV appends the result to the file at path as one line of
// tab-separated fields: label, mode, decisions/s, p50 and p99 in
// microseconds, then the CPU per decision in microseconds of the service,
// the load generator and the store (each empty when unknown).
func (r result) appendTSV(path, mode string, o options) error {
	line := fmt.Sprintf("%s\t%s\t%.0f\t%d\t%d", o.label, mode, float64(r.decisions)/r.elapsed.Seconds(),
		r.p50.Microseconds(), r.p99.Microseconds())
	for p := range nprocs {
		line += "\t"
		if us, ok := r.perDecision(p); ok {
			line += strconv.FormatFloat(us, 'f', 1, 64)
		}
	}
	line += "\n"
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// cpuTime returns a process's user + system CPU time from /proc.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// Fields after the command name (which may hold spaces) in parens.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("unexpected /proc stat format")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, errors.New("unexpected /proc stat format")
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("unexpected /proc stat format")
	}
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticks, nil
}

// cpuWindow is the CPU time of the processes a run measures at the start of
// its measured window.
type cpuWindow struct {
	pids [nprocs]int
	t0   [nprocs]time.Duration
	ok   [nprocs]bool
}

// startCPU reads the CPU time of the service, the load generator and the
// store that o names (those with a process id) at the start of a measured
// window.
func startCPU(o options) *cpuWindow {
	w := &cpuWindow{pids: [nprocs]int{procService: o.pid, procLoad: os.Getpid(), procStore: o.storePID}}
	for p, pid := range w.pids {
		if pid > 0 {
			t, err := cpuTime(pid)
			w.t0[p], w.ok[p] = t, err == nil
		}
	}
	return w
}

// end records in r the CPU time each process spent since startCPU.
func (w *cpuWindow) end(r *result) {
	for p, pid := range w.pids {
		if !w.ok[p] {
			continue
		}
		if t, err := cpuTime(pid); err == nil {
			r.cpu[p], r.cpuKnown[p] = t-w.t0[p], true
		}
	}
}

// startProfile starts a CPU profile of the load generator into the file
// at path, when path is not empty, and returns what stops it.
func startProfile(path string) (func() error, error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

func values(o options) []string {
	v := make([]string, o.values)
	for i := range v {
		v[i] = "v" + strconv.Itoa(i)
	}
	return v
}

func percentiles(lat []time.Duration) (p50, p99, p999 time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	at := func(q float64) time.Duration { return lat[min(len(lat)-1, int(q*float64(len(lat))))] }
	return at(0.50), at(0.99), at(0.999)
}

// shouldRateLimit is the method serveload calls, by its full name.
const shouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// newCallers returns how each of o.inflight workers makes its calls to
// addr: a function sending request i of reqs (proto bytes) and returning
// the response's overall code, over o.conns connections. The lean client
// (h2conn) is the default; --client grpc-go makes the calls through
// grpc-go's client, with requests encoded once and only overall_code read
// (leanCodec), to compare. close closes the connections.
func newCallers(addr string, o options, reqs [][]byte) (callers []func(i int) (pb.RateLimitResponse_Code, error), close func(), err error) {
	var closers []func() error
	close = func() {
		for _, c := range closers {
			c()
		}
	}
	switch o.client {
	case "lean":
		bodies := make([][]byte, len(reqs))
		for i, r := range reqs {
			bodies[i] = grpcFrame(r)
		}
		var conns []*h2conn
		for range max(1, o.conns) {
			c, err := dialH2(addr)
			if err != nil {
				close()
				return nil, nil, err
			}
			closers = append(closers, c.Close)
			conns = append(conns, c)
		}
		for w := range o.inflight {
			c, cl := conns[w%len(conns)], newH2call()
			callers = append(callers, func(i int) (pb.RateLimitResponse_Code, error) {
				if err := c.call(shouldRateLimit, bodies[i], cl); err != nil {
					return 0, err
				}
				return readOverall(cl.msg)
			})
		}
	case "grpc-go":
		var conns []*grpc.ClientConn
		for range max(1, o.conns) {
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithDefaultCallOptions(grpc.ForceCodecV2(leanCodec{})))
			if err != nil {
				close()
				return nil, nil, err
			}
			closers = append(closers, conn.Close)
			conns = append(conns, conn)
		}
		for w := range o.inflight {
			c, resp := conns[w%len(conns)], new(overallCode)
			callers = append(callers, func(i int) (pb.RateLimitResponse_Code, error) {
				err := c.Invoke(context.Background(), shouldRateLimit, encodedRequest(reqs[i]), resp)
				return resp.code, err
			})
		}
	default:
		return nil, nil, fmt.Errorf("unknown --client %q: lean or grpc-go", o.client)
	}
	return callers, close, nil
}

// runGRPC drives ShouldRateLimit at addr: o.inflight workers calling as
// fast as answers come (a closed loop), measured for o.duration after
// o.warmup.
func runGRPC(addr string, o options) (result, error) {
	reqs, err := encodeRequests(o)
	if err != nil {
		return result{}, err
	}
	callers, closeConns, err := newCallers(addr, o, reqs)
	if err != nil {
		return result{}, err
	}
	defer closeConns()
	g := new(grpcLoad)
	for w := range o.inflight {
		g.wg.Add(1)
		go g.work(w, callers[w], len(reqs))
	}
	time.Sleep(o.warmup)
	if err := g.measure(o); err != nil {
		return result{}, err
	}
	return g.finish(), nil
}

// encodeRequests encodes a request for each of o's values in advance: the
// load generator's own work would otherwise compete with the service for
// the same two cores.
func encodeRequests(o options) ([][]byte, error) {
	vals := values(o)
	reqs := make([][]byte, len(vals))
	for i, v := range vals {
		b, err := proto.Marshal(&pb.RateLimitRequest{Domain: o.domain, Descriptors: []*rlv3.RateLimitDescriptor{{
			Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: o.key, Value: v}}}}})
		if err != nil {
			return nil, err
		}
		reqs[i] = b
	}
	return reqs, nil
}

// grpcLoad is runGRPC's closed loop: workers that call as fast as answers
// come, counting what they see while measuring is on, until stop.
type grpcLoad struct {
	measuring atomic.Bool
	stop      atomic.Bool
	wg        sync.WaitGroup
	mu        sync.Mutex
	res       result
	lats      [][]time.Duration
}

// work is worker w, calling with call the requests numbered below nreqs
// at random, until g.stop; it adds its counts to g.res when it stops.
func (g *grpcLoad) work(w int, call func(i int) (pb.RateLimitResponse_Code, error), nreqs int) {
	defer g.wg.Done()
	rng := rand.New(rand.NewPCG(uint64(w), 42))
	lat := make([]time.Duration, 0, 1<<16)
	var n, errs, over int
	var firstErr string
	for !g.stop.Load() {
		i := rng.IntN(nreqs)
		start := time.Now()
		code, err := call(i)
		took := time.Since(start)
		if !g.measuring.Load() {
			continue
		}
		n++
		lat = append(lat, took)
		if err != nil {
			errs++
			if firstErr == "" {
				firstErr = err.Error()
			}
		} else if code == pb.RateLimitResponse_OVER_LIMIT {
			over++
		}
	}
	g.mu.Lock()
	g.res.decisions += n
	g.res.errors += errs
	g.res.overLimit += over
	if g.res.firstError == "" {
		g.res.firstError = firstErr
	}
	g.lats = append(g.lats, lat)
	g.mu.Unlock()
}

// measure counts the workers' calls for o.duration, with the CPU time the
// load generator and the service (o.pid) spend meanwhile, under the
// profile o asks for. On an error it stops the workers.
func (g *grpcLoad) measure(o options) error {
	cpu := startCPU(o)
	stopProfile, err := startProfile(o.profile)
	if err != nil {
		g.stop.Store(true)
		g.wg.Wait()
		return err
	}
	start := time.Now()
	g.measuring.Store(true)
	time.Sleep(o.duration)
	g.measuring.Store(false)
	if err := stopProfile(); err != nil {
		g.stop.Store(true)
		g.wg.Wait()
		return err
	}
	g.res.elapsed = time.Since(start)
	cpu.end(&g.res)
	return nil
}

// finish stops the workers and returns what they counted, with the
// percentiles of every latency measured.
func (g *grpcLoad) finish() result {
	g.stop.Store(true)
	g.wg.Wait()
	var all []time.Duration
	for _, l := range g.lats {
		all = append(all, l...)
	}
	g.res.p50, g.res.p99, g.res.p999 = percentiles(all)
	return g.res
}

// runJSON drives /json with vegeta: o.inflight workers sending as fast as
// answers come (a closed loop, like the gRPC mode).
func runJSON(url string, o options) (result, error) {
	vals := values(o)
	bodies := make([][]byte, len(vals))
	for i, v := range vals {
		bodies[i] = []byte(`{"domain":"` + o.domain + `","descriptors":[{"entries":[{"key":"` + o.key + `","value":"` + v + `"}]}]}`)
	}
	var seq atomic.Uint64
	header := http.Header{"Content-Type": []string{"application/json"}}
	targeter := func(t *vegeta.Target) error {
		// A multiplicative hash of a counter spreads requests over the
		// values without a shared random source.
		i := (seq.Add(1) * 0x9E3779B97F4A7C15) >> 32 % uint64(len(bodies))
		t.Method, t.URL, t.Body, t.Header = http.MethodPost, url, bodies[i], header
		return nil
	}
	attack := func(d time.Duration, m *vegeta.Metrics) {
		a := vegeta.NewAttacker(vegeta.Workers(uint64(o.inflight)), vegeta.MaxWorkers(uint64(o.inflight)),
			vegeta.Connections(o.inflight), vegeta.KeepAlive(true))
		for r := range a.Attack(targeter, vegeta.Rate{Freq: 0}, d, "serveload") {
			if m != nil {
				m.Add(r)
			}
		}
	}
	attack(o.warmup, nil)
	var m vegeta.Metrics
	cpu := startCPU(o)
	start := time.Now()
	attack(o.duration, &m)
	elapsed := time.Since(start)
	m.Close()
	res := result{decisions: int(m.Requests), elapsed: elapsed, p50: m.Latencies.P50, p99: m.Latencies.P99, p999: m.Latencies.Quantile(0.999)}
	cpu.end(&res)
	for code, n := range m.StatusCodes {
		switch code {
		case "200":
		case "429":
			res.overLimit += n
		default:
			res.errors += n
		}
	}
	if len(m.Errors) > 0 {
		res.firstError = m.Errors[0]
	}
	return res, nil
}

// ask sends one ShouldRateLimit request and prints the response in
// protojson, like envoyproxy/ratelimit's client:
//
//	serveload ask --addr 127.0.0.1:8081 --domain edge --descriptors remote_address=10.0.0.1 --descriptors tenant=a,user=b
func ask(args []string) int {
	fs := flag.NewFlagSet("serveload ask", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:8081", "gRPC address")
	domain := fs.String("domain", "", "domain")
	hits := fs.Uint("hits", 0, "hits_addend of the request (0 means 1)")
	var descs []string
	fs.Func("descriptors", "a descriptor: key=value,key=value (repeatable)", func(s string) error { descs = append(descs, s); return nil })
	fs.Parse(args)
	req := &pb.RateLimitRequest{Domain: *domain, HitsAddend: uint32(*hits)}
	for _, d := range descs {
		desc := &rlv3.RateLimitDescriptor{}
		for _, kv := range strings.Split(d, ",") {
			k, v, _ := strings.Cut(kv, "=")
			desc.Entries = append(desc.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		req.Descriptors = append(req.Descriptors, desc)
	}
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "serveload:", err)
		return 1
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
	if err != nil {
		fmt.Fprintln(os.Stderr, "serveload:", err)
		return 1
	}
	fmt.Println(protojson.Format(resp))
	return 0
}
