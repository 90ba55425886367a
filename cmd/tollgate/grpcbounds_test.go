package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/internal/test/testkit"
)

const shouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// TestServeGRPCMetadataBound: a call's metadata is bounded as HTTP's
// headers are (64 KiB): a grpc-go client is told the bound and does not
// send 1 MiB, and a client that sends it anyway, in one field or in many,
// is refused without an answer; a call within the bound is answered.
func TestServeGRPCMetadataBound(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, rulesFile(10))
	p := startTollgate(t, "serve", "--config", path)
	req := request("reload", desc("k", randomID()))

	ask := func(md metadata.MD) error {
		ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(context.Background(), md), 10*time.Second)
		defer cancel()
		_, err := p.rls.ShouldRateLimit(ctx, req)
		return err
	}
	if err := ask(metadata.Pairs("x-pad", strings.Repeat("a", 60<<10))); err != nil {
		t.Errorf("60 KiB of metadata: %v, want an answer", err)
	}
	if err := ask(metadata.Pairs("x-pad", strings.Repeat("a", 1<<20))); err == nil {
		t.Errorf("1 MiB of metadata was answered; want it refused")
	}

	msg, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	one := [][2]string{{"x-pad", strings.Repeat("a", 1<<20)}}
	var many [][2]string
	for i := range 128 {
		many = append(many, [2]string{fmt.Sprintf("x-pad-%d", i), strings.Repeat("a", 8<<10)})
	}
	for _, tc := range []struct {
		name   string
		fields [][2]string
		want   string
	}{
		{"none", nil, "grpc-status 0"},
		{"one field of 1 MiB", one, "refused"},
		{"128 fields of 8 KiB", many, "refused"},
	} {
		got := rawCall(t, p.grpc, tc.fields, msg)
		t.Logf("raw HTTP/2 call, %s of metadata: %s", tc.name, got)
		if tc.want == "refused" && got != "grpc-status 0" {
			got = "refused"
		}
		if got != tc.want {
			t.Errorf("raw HTTP/2 call, %s of metadata: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// rawCall makes a ShouldRateLimit call on a connection of its own, as a
// client that ignores the server's settings would: headers with fields
// besides the call's own, then msg. It returns how it ended: "grpc-status
// N", or what the server did instead.
func rawCall(t *testing.T, addr string, fields [][2]string, msg []byte) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		return "write: " + err.Error()
	}
	fr := http2.NewFramer(conn, conn)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.MaxHeaderListSize = 1 << 20
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range append([][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", shouldRateLimit},
		{":authority", addr}, {"content-type", "application/grpc"}, {"te", "trailers"}}, fields...) {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	sent := func() error {
		if err := fr.WriteSettings(); err != nil {
			return err
		}
		b := block.Bytes()
		for first := true; first || len(b) > 0; first = false {
			chunk := b[:min(len(b), 16<<10)]
			b = b[len(chunk):]
			var err error
			if first {
				err = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: chunk, EndHeaders: len(b) == 0})
			} else {
				err = fr.WriteContinuation(1, len(b) == 0, chunk)
			}
			if err != nil {
				return err
			}
		}
		data := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg)))
		return fr.WriteData(1, true, append(data, msg...))
	}()
	if sent != nil {
		return "write: " + sent.Error()
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return "read: " + err.Error()
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.RSTStreamFrame:
			return "RST_STREAM " + f.ErrCode.String()
		case *http2.GoAwayFrame:
			return "GOAWAY " + f.ErrCode.String()
		case *http2.MetaHeadersFrame:
			if s := f.PseudoValue("status"); s != "" && s != "200" {
				return "HTTP " + s
			}
			for _, hf := range f.Fields {
				if hf.Name == "grpc-status" {
					return "grpc-status " + hf.Value
				}
			}
		}
	}
}

// stalledCall opens a ShouldRateLimit call on conn that sends its headers,
// with pad bytes of metadata, and never its message. The channel gets how
// it ended.
func stalledCall(ctx context.Context, conn *grpc.ClientConn, pad int) <-chan error {
	done := make(chan error, 1)
	ctx = metadata.NewOutgoingContext(ctx, metadata.Pairs("x-pad", strings.Repeat("a", pad)))
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, shouldRateLimit)
	if err != nil {
		done <- err
		return done
	}
	go func() { done <- st.RecvMsg(new(pb.RateLimitResponse)) }()
	return done
}

// dialN opens n gRPC connections to addr.
func dialN(t *testing.T, addr string, n int) []*grpc.ClientConn {
	t.Helper()
	var conns []*grpc.ClientConn
	for range n {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		c.Connect()
		t.Cleanup(func() { c.Close() })
		conns = append(conns, c)
	}
	return conns
}

// awaitMetric waits until the series prefix of p's /metrics is want.
func awaitMetric(t *testing.T, p *proc, prefix string, want float64) {
	t.Helper()
	testkit.Eventually(t, fmt.Sprintf("%s = %v", prefix, want), func() bool { return p.metric(prefix) == want })
}

// TestServeGRPCWaitingCallsBounded: calls whose headers came but whose
// message does not hold their metadata; however many connections they
// come on, at most --grpc-max-waiting-calls (1024) wait at once, and the
// calls past them are refused until some end: cancelled at once when they
// send no message, RESOURCE_EXHAUSTED when they do. A call waits for its
// message at most --grpc-message-timeout; then it is cancelled and its
// room is free for others.
func TestServeGRPCWaitingCallsBounded(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, rulesFile(10))

	t.Run("count", func(t *testing.T) {
		t.Parallel()
		p := startTollgate(t, "serve", "--config", path)
		const conns, each, bound = 3, 400, 1024
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var calls []<-chan error
		for _, c := range dialN(t, p.grpc, conns) {
			for range each {
				calls = append(calls, stalledCall(ctx, c, 16<<10))
			}
		}
		awaitMetric(t, p, "tollgate_serve_grpc_waiting_calls", bound)
		// The calls past the bound end, and the others still wait.
		ended := 0
		testkit.Eventually(t, "the calls past the bound ended", func() bool {
			for i, c := range calls {
				select {
				case err := <-c:
					if status.Code(err) != codes.Canceled {
						t.Fatalf("a call past the bound ended with %v, want CANCELLED", err)
					}
					calls[i] = nil
					ended++
				default:
				}
			}
			return ended >= conns*each-bound
		})
		if got, want := p.metric("tollgate_serve_grpc_waiting_calls"), float64(bound); got != want {
			t.Errorf("%v calls waiting once the others ended, want %v", got, want)
		}
		if _, err := p.rls.ShouldRateLimit(ctx, request("reload", desc("k", randomID()))); status.Code(err) != codes.ResourceExhausted {
			t.Errorf("a call with its message while %d wait: %v, want RESOURCE_EXHAUSTED", bound, err)
		}
		if got, want := p.metric(`tollgate_serve_grpc_stalled_calls_total{reason="too_many"}`), float64(conns*each-bound+1); got != want {
			t.Errorf("calls refused: %v, want %v", got, want)
		}
		cancel() // the clients give up: their calls end, and room is free
		awaitMetric(t, p, "tollgate_serve_grpc_waiting_calls", 0)
		p.ask(request("reload", desc("k", randomID())))
	})

	t.Run("timeout", func(t *testing.T) {
		t.Parallel()
		p := startTollgate(t, "serve", "--config", path, "--grpc-max-waiting-calls", "20", "--grpc-message-timeout", "1s")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var calls []<-chan error
		for _, c := range dialN(t, p.grpc, 4) {
			for range 5 {
				calls = append(calls, stalledCall(ctx, c, 32<<10))
			}
		}
		// Until the stalled calls are cut, the bound holds for every
		// caller: a call with its message is refused too.
		awaitMetric(t, p, "tollgate_serve_grpc_waiting_calls", 20)
		if _, err := p.rls.ShouldRateLimit(ctx, request("reload", desc("k", randomID()))); status.Code(err) != codes.ResourceExhausted {
			t.Errorf("a 21st call: %v, want RESOURCE_EXHAUSTED", err)
		}
		for i, c := range calls {
			select {
			case err := <-c:
				if status.Code(err) != codes.Canceled {
					t.Errorf("stalled call %d: %v, want CANCELLED after --grpc-message-timeout", i, err)
				}
			case <-time.After(time.Minute):
				t.Fatalf("stalled call %d still waiting a minute later, want it cut after --grpc-message-timeout (1s)", i)
			}
		}
		if got := p.metric(`tollgate_serve_grpc_stalled_calls_total{reason="timeout"}`); got != 20 {
			t.Errorf("stalled calls cut: %v, want 20", got)
		}
		awaitMetric(t, p, "tollgate_serve_grpc_waiting_calls", 0)
		p.ask(request("reload", desc("k", randomID())))
	})
}

// TestServeGRPCRefusedCallsKeepNothing: calls refused past the bound keep
// nothing once they are refused, even those asking for a deadline that
// never comes (grpc-go keeps the timer of a deadline until it passes for
// a call that its tap refuses, 300 to 450 bytes): 40,000 of them on one
// connection, each asking for 99,999,999 hours, leave the heap as it was,
// give or take.
func TestServeGRPCRefusedCallsKeepNothing(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, rulesFile(10))
	debug := freePort(t)
	p := startTollgate(t, "serve", "--config", path, "--grpc-max-waiting-calls", "1", "--grpc-message-timeout", "10m", "--debug", debug)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stalled := stalledCall(ctx, p.conn, 0)
	awaitMetric(t, p, "tollgate_serve_grpc_waiting_calls", 1)
	heap := func() float64 {
		t.Helper()
		resp, err := http.Get("http://" + debug + "/debug/pprof/heap?gc=1") // collects first
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return p.metric("go_memstats_heap_inuse_bytes")
	}
	before := heap()
	const calls = 40_000
	floodHeaders(t, p.grpc, calls, "99999999H")
	if got := p.metric(`tollgate_serve_grpc_stalled_calls_total{reason="too_many"}`); got != calls {
		t.Errorf("%v calls refused, want %d", got, calls)
	}
	grown := heap() - before
	t.Logf("heap after %d refused calls: %+.1f MB", calls, grown/1e6)
	if grown > 7e6 {
		t.Errorf("heap grew by %.1f MB after %d refused calls, want them to keep nothing (at most 7 MB of noise)", grown/1e6, calls)
	}
	cancel()
	<-stalled
}

// floodHeaders opens n calls on a connection of its own, one HEADERS frame
// each asking for deadline timeout (grpc-timeout), never sending a message,
// opening each once the server has ended enough of the others to keep
// within its limit of streams, and returns once the server has ended all.
func floodHeaders(t *testing.T, addr string, n int, timeout string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Minute))
	conn.Write([]byte(http2.ClientPreface))
	fr := http2.NewFramer(conn, conn)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{}, 1024)
	go func() {
		seen := map[uint32]bool{} // a call may end with trailers and a reset both
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				close(ended)
				return
			}
			id := f.Header().StreamID
			switch f := f.(type) {
			case *http2.RSTStreamFrame:
			case *http2.MetaHeadersFrame:
				if !f.StreamEnded() {
					continue
				}
			default:
				continue
			}
			if !seen[id] {
				seen[id] = true
				ended <- struct{}{}
			}
		}
	}()
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	open := 0
	for i := range n {
		for open >= 512 { // well within --grpc-max-concurrent-streams
			if _, ok := <-ended; !ok {
				t.Fatalf("the connection ended after %d calls", i)
			}
			open--
		}
		block.Reset()
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", shouldRateLimit}, {":authority", addr},
			{"content-type", "application/grpc"}, {"te", "trailers"}, {"grpc-timeout", timeout}} {
			enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		open++
	}
	for ; open > 0; open-- {
		if _, ok := <-ended; !ok {
			t.Fatalf("the connection ended with %d calls open", open)
		}
	}
}
