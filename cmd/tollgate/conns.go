package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// connFlags bound what one client can hold on the service's listeners: how
// long it may take to send a request, to read an answer, and to sit idle,
// how big its headers may be, and how many streams it may open on one gRPC
// connection. Without them, a few hundred idle or deliberately slow
// connections exhaust the process's file descriptors and the health check
// goes unanswered.
type connFlags struct {
	readTimeout       time.Duration
	writeTimeout      time.Duration
	idleTimeout       time.Duration
	maxHeaderBytes    int
	debugWriteTimeout time.Duration

	grpcMaxConnIdle    time.Duration
	grpcKeepalive      time.Duration
	grpcKeepaliveWait  time.Duration
	grpcMinPing        time.Duration
	grpcMaxStreams     uint
	grpcHandshakeLimit time.Duration
	grpcMaxHeaderBytes int
	grpcMaxWaiting     int
	grpcMessageTimeout time.Duration
}

// registerHTTP registers the HTTP server's bounds. writeDefault is the
// default of --write-timeout: the longest answer a listener legitimately
// gives (the decision service's are milliseconds; a proxy's are the
// upstream's).
func (c *connFlags) registerHTTP(fs *flag.FlagSet, writeDefault time.Duration) {
	fs.DurationVar(&c.readTimeout, "read-timeout", 10*time.Second, "HTTP: longest time a client may take to send a whole request, headers and body; a slower one is disconnected")
	fs.DurationVar(&c.writeTimeout, "write-timeout", writeDefault, "HTTP: longest time from the end of a request's headers to the end of its answer; keep it above the slowest legitimate answer")
	fs.DurationVar(&c.idleTimeout, "idle-timeout", 2*time.Minute, "HTTP: how long a keep-alive connection may wait for its next request before it is closed")
	fs.IntVar(&c.maxHeaderBytes, "max-header-bytes", 64<<10, "HTTP: largest request line and headers a client may send, in bytes")
}

// registerDebug registers the debug listener's write bound, which must let
// a CPU profile or a trace of the length asked for finish.
func (c *connFlags) registerDebug(fs *flag.FlagSet) {
	fs.DurationVar(&c.debugWriteTimeout, "debug-write-timeout", 2*time.Minute, "debug listener: longest answer, and so the longest CPU profile or trace (/debug/pprof/profile?seconds=N needs N below it)")
}

// registerGRPC registers the gRPC server's bounds.
func (c *connFlags) registerGRPC(fs *flag.FlagSet) {
	fs.DurationVar(&c.grpcMaxConnIdle, "grpc-max-connection-idle", 5*time.Minute, "gRPC: close a connection (GOAWAY) that has had no call for this long; clients reconnect when they next need one")
	fs.DurationVar(&c.grpcKeepalive, "grpc-keepalive-time", time.Minute, "gRPC: ping a connection that has been quiet for this long, to find dead peers")
	fs.DurationVar(&c.grpcKeepaliveWait, "grpc-keepalive-timeout", 20*time.Second, "gRPC: close a connection whose ping is not answered within this")
	fs.DurationVar(&c.grpcMinPing, "grpc-min-ping-interval", 10*time.Second, "gRPC: close a connection whose client pings more often than this")
	fs.UintVar(&c.grpcMaxStreams, "grpc-max-concurrent-streams", 1024, "gRPC: most calls in flight on one connection; a client wanting more waits or opens another connection")
	fs.DurationVar(&c.grpcHandshakeLimit, "grpc-handshake-timeout", 10*time.Second, "gRPC: longest time a new connection may take to send its HTTP/2 preface and settings")
	fs.IntVar(&c.grpcMaxHeaderBytes, "grpc-max-header-bytes", 64<<10, "gRPC: largest metadata (header list) of one call, in bytes; a call with more is refused")
	fs.IntVar(&c.grpcMaxWaiting, "grpc-max-waiting-calls", 1024, "gRPC: most calls, over all connections, whose headers came and whose request message has not; more are refused (RESOURCE_EXHAUSTED)")
	fs.DurationVar(&c.grpcMessageTimeout, "grpc-message-timeout", 10*time.Second, "gRPC: longest time a call may take to send its request message after its headers; a slower one is cancelled")
}

// check rejects bounds that would switch a protection off by accident.
func (c *connFlags) check(grpcToo, debug bool) error {
	type bound struct {
		name string
		d    time.Duration
	}
	bs := []bound{{"--read-timeout", c.readTimeout}, {"--write-timeout", c.writeTimeout}, {"--idle-timeout", c.idleTimeout}}
	if debug {
		bs = append(bs, bound{"--debug-write-timeout", c.debugWriteTimeout})
	}
	if grpcToo {
		bs = append(bs, bound{"--grpc-max-connection-idle", c.grpcMaxConnIdle}, bound{"--grpc-keepalive-time", c.grpcKeepalive},
			bound{"--grpc-keepalive-timeout", c.grpcKeepaliveWait}, bound{"--grpc-min-ping-interval", c.grpcMinPing},
			bound{"--grpc-handshake-timeout", c.grpcHandshakeLimit}, bound{"--grpc-message-timeout", c.grpcMessageTimeout})
	}
	for _, b := range bs {
		if b.d <= 0 {
			return fmt.Errorf("%s %v: want a positive duration", b.name, b.d)
		}
	}
	if c.maxHeaderBytes < 4<<10 {
		return fmt.Errorf("--max-header-bytes %d: want at least 4096", c.maxHeaderBytes)
	}
	if grpcToo && (c.grpcMaxStreams == 0 || c.grpcMaxStreams > 1<<31-1) {
		return fmt.Errorf("--grpc-max-concurrent-streams %d: want 1 to %d", c.grpcMaxStreams, 1<<31-1)
	}
	if grpcToo && (c.grpcMaxHeaderBytes < 4<<10 || c.grpcMaxHeaderBytes > 1<<31-1) {
		return fmt.Errorf("--grpc-max-header-bytes %d: want 4096 to %d", c.grpcMaxHeaderBytes, 1<<31-1)
	}
	if grpcToo && c.grpcMaxWaiting <= 0 {
		return fmt.Errorf("--grpc-max-waiting-calls %d: want a positive number", c.grpcMaxWaiting)
	}
	return nil
}

// httpServer returns an HTTP server for h with the bounds applied. Its own
// complaints (accept errors, TLS handshakes, panics) go to log, in the
// service's log format.
func (c *connFlags) httpServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ReadHeaderTimeout: min(c.readTimeout, 10*time.Second),
		ReadTimeout:       c.readTimeout,
		WriteTimeout:      c.writeTimeout,
		IdleTimeout:       c.idleTimeout,
		MaxHeaderBytes:    c.maxHeaderBytes,
	}
}

// debugServer returns the debug listener's server: the same bounds but a
// write timeout long enough for profiles.
func (c *connFlags) debugServer(h http.Handler, log *slog.Logger) *http.Server {
	s := c.httpServer(h, log)
	s.WriteTimeout = c.debugWriteTimeout
	return s
}

// grpcStreamWorkers is how many goroutines the gRPC server keeps to run
// calls on. A call that finds them all busy gets a goroutine of its own,
// whose stack starts small and grows, copied at each doubling, on its way
// down to the store: with two workers and 64 calls in flight on Redis,
// 7–9% of the service's CPU went to growing stacks (runtime.newstack),
// with 64 workers under 1%, and the CPU per decision fell by about a
// tenth. A worker waiting on Redis is busy, so the count to match is the
// calls in flight, not the cores; more workers than calls measured no
// better (128, 256; 1,024 worse), each idle one holding a grown stack of a
// few kilobytes.
const grpcStreamWorkers = 64

// grpcOptions returns the gRPC server options that apply the bounds, and
// the server's stream workers; the bound on calls waiting for their
// message registers its metrics on reg. Read and write buffers (32 KiB
// each), flow-control windows and a shared write buffer stay at grpc-go's
// defaults: 8 and 64 KiB buffers, static 1 MiB windows and the shared
// buffer measured no better for the service's small messages.
func (c *connFlags) grpcOptions(reg prometheus.Registerer) ([]grpc.ServerOption, error) {
	wait := newWaitingCalls(c.grpcMaxWaiting, c.grpcMessageTimeout)
	if err := wait.register(reg); err != nil {
		return nil, err
	}
	return append(wait.options(),
		grpc.NumStreamWorkers(grpcStreamWorkers),
		// grpc-go's own bound is 16 MiB a call; it tells clients this
		// one in its settings, and refuses a call past it (RST_STREAM).
		grpc.MaxHeaderListSize(uint32(c.grpcMaxHeaderBytes)),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: c.grpcMaxConnIdle,
			Time:              c.grpcKeepalive,
			Timeout:           c.grpcKeepaliveWait,
		}),
		// Envoy and grpc-go clients that ping no more often than this,
		// with or without calls in flight, keep their connections.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             c.grpcMinPing,
			PermitWithoutStream: true,
		}),
		grpc.MaxConcurrentStreams(uint32(c.grpcMaxStreams)),
		grpc.ConnectionTimeout(c.grpcHandshakeLimit),
	), nil
}
