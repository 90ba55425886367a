package xds

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/service/config"
)

// Updater puts rules in force; *service.Server is one. Update returns
// the load's error, or why the rules could not be put in force, and keeps
// the rules in force then.
type Updater interface {
	Update(source string, load func() (*config.Rules, error)) error
}

// Config says which management server to follow and how.
type Config struct {
	// Server is the management server's address, host:port (or any
	// target gRPC takes).
	Server string
	// NodeID and NodeMetadata say who asks: the management server keeps
	// a snapshot per node id (Envoy Gateway's is "envoy-ratelimit").
	NodeID       string
	NodeMetadata map[string]string
	// Headers are sent with the stream (ParseHeaders). They are
	// credentials as a rule, and never logged nor put in an error.
	Headers map[string]string
	// TLS, when not nil, is how to speak TLS to the server; nil is
	// plaintext.
	TLS *TLSFiles
	// Backoff is how long to wait before reconnecting; its zero value
	// waits about a millisecond: set DefaultBackoff or your own.
	Backoff Backoff
	// MaxMessageBytes is the largest response taken from the server:
	// the first bound on what one push can cost. 0 is gRPC's default,
	// 4 MiB.
	MaxMessageBytes int
	// Limits and Merge are how the pushed rules are loaded: the limits
	// of a directory of files, and envoy's MERGE_DOMAIN_CONFIG.
	Limits config.Limits
	Merge  bool
	// Log gets the client's own lines (a connection lost, say), at most
	// one per LogEvery for failures alike; the loads are logged by the
	// Updater.
	Log      *slog.Logger
	LogEvery time.Duration
}

// repeatPause is how long the client waits before refusing again a
// response it has just refused. go-control-plane answers every NACK by
// sending the same snapshot again at once, for as long as the snapshot
// stays: without a pause the two would refuse and resend thousands of
// times a second. It bounds that to about ten a second, and delays the
// next snapshot, once there is one, by as much at most.
const repeatPause = 100 * time.Millisecond

// maxNackMessage bounds the error a NACK carries back: the loader's
// message, which lists at most 20 problems, cut to this many bytes.
const maxNackMessage = 16 << 10

// Client follows one management server's RateLimitConfig resources and
// puts them in force through its Updater. Each response is the whole set
// of domains (State of the World): a domain left out is deleted. Every
// response is loaded whatever its version says — a management server
// that restarts numbers its versions from "1" again — and one identical
// to the rules in force changes nothing. A response the loader refuses is
// NACKed with the loader's message and the rules in force stay.
type Client struct {
	cfg      Config
	to       Updater
	node     *core.Node
	loadOpts []config.Option
	md       metadata.MD

	first     chan struct{}
	firstOnce sync.Once

	// The last response refused, by its digest, and why: the same
	// response again is refused again without loading it anew.
	refused    [sha256.Size]byte
	refusedErr error

	logs engine.Sampler // of failures to reach the server
}

// New returns a client for cfg that updates to. It checks the TLS files
// at once, so that a missing certificate stops a start rather than every
// connection.
func New(cfg Config, to Updater) (*Client, error) {
	if cfg.Server == "" {
		return nil, errors.New("xds: no management server address")
	}
	if cfg.TLS != nil {
		if _, err := cfg.TLS.config(); err != nil {
			return nil, err
		}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	fields := make(map[string]*structpb.Value, len(cfg.NodeMetadata))
	for k, v := range cfg.NodeMetadata {
		fields[k] = structpb.NewStringValue(v)
	}
	c := &Client{
		cfg:      cfg,
		to:       to,
		node:     &core.Node{Id: cfg.NodeID, Metadata: &structpb.Struct{Fields: fields}, UserAgentName: "tollgate"},
		loadOpts: []config.Option{config.WithLimits(cfg.Limits)},
		first:    make(chan struct{}),
		logs:     engine.Sampler{Every: cfg.LogEvery},
	}
	if cfg.Merge {
		c.loadOpts = append(c.loadOpts, config.WithMergeDomains())
	}
	if len(cfg.Headers) > 0 {
		c.md = metadata.New(cfg.Headers)
	}
	return c, nil
}

// FirstResponse is closed once the first response has been handled,
// loaded or refused: what envoyproxy/ratelimit waits for before it
// serves, unless FORCE_START_WITHOUT_INITIAL_CONFIG.
func (c *Client) FirstResponse() <-chan struct{} { return c.first }

// Run follows the management server until ctx ends: it connects, asks for
// every RateLimitConfig of its node, answers each response with an ACK or
// a NACK, and when the connection or the stream fails, waits as Backoff
// says and connects again. The rules in force stay in force meanwhile.
func (c *Client) Run(ctx context.Context) {
	fails := 0
	for {
		delivered, err := c.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if delivered {
			fails = 0
		}
		fails++
		wait := c.cfg.Backoff.next(fails)
		if ok, skipped := c.logs.Allow(time.Now()); ok {
			c.cfg.Log.Warn("xDS: no stream to the management server; reconnecting",
				"server", c.cfg.Server, "error", errText(err), "in", wait.Round(time.Millisecond).String(), engine.Skipped(skipped))
		}
		if !sleep(ctx, wait) {
			return
		}
	}
}

// session is one connection and stream: it returns when either fails, or
// ctx ends, and reports whether a response came.
func (c *Client) session(ctx context.Context) (delivered bool, err error) {
	opts, err := c.dialOptions()
	if err != nil {
		return false, err
	}
	conn, err := grpc.NewClient(c.cfg.Server, opts...)
	if err != nil {
		return false, fmt.Errorf("xds: %w", err)
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if c.md != nil {
		sctx = metadata.NewOutgoingContext(sctx, c.md)
	}
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
	if err != nil {
		return false, err
	}
	// A new stream asks from no version: the server sends its whole state
	// whatever it was before, even if it restarted and reuses versions.
	accepted := ""
	if err := stream.Send(c.request(TypeURL, accepted, "", nil)); err != nil {
		return false, err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return delivered, err
		}
		delivered = true
		req, ok := c.answer(ctx, resp, &accepted)
		if !ok {
			return delivered, ctx.Err()
		}
		if err := stream.Send(req); err != nil {
			return delivered, err
		}
	}
}

// dialOptions are the connection's: TLS or not, the largest response,
// and keepalive pings, so that a server gone without a word (its node
// lost) is noticed within minutes rather than never. The pings are far
// enough apart for gRPC servers' default policy, which refuses pings more
// often than every five minutes.
func (c *Client) dialOptions() ([]grpc.DialOption, error) {
	creds := insecure.NewCredentials()
	if c.cfg.TLS != nil {
		tc, err := c.cfg.TLS.config()
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(tc)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 6 * time.Minute, Timeout: 20 * time.Second}),
	}
	if n := c.cfg.MaxMessageBytes; n > 0 {
		opts = append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(n)))
	}
	return opts, nil
}

// answer loads resp and returns its ACK or NACK; accepted is the last
// version accepted on the stream, which a NACK repeats, as the protocol
// asks. It reports false when ctx ended first.
func (c *Client) answer(ctx context.Context, resp *discovery.DiscoveryResponse, accepted *string) (*discovery.DiscoveryRequest, bool) {
	if resp.GetTypeUrl() != TypeURL {
		return c.request(resp.GetTypeUrl(), "", resp.GetNonce(), nack("xds: tollgate asks for "+TypeURL+" only")), true
	}
	key := digest(resp.GetResources())
	var load func() (*config.Rules, error)
	if c.refusedErr != nil && key == c.refused {
		if !sleep(ctx, repeatPause) {
			return nil, false
		}
		err := c.refusedErr
		load = func() (*config.Rules, error) { return nil, err }
	} else {
		load = func() (*config.Rules, error) {
			srcs, err := sources(resp.GetResources(), fileLimit(c.cfg.Limits))
			if err != nil {
				return nil, err
			}
			return config.ParseSources(srcs, c.loadOpts...)
		}
	}
	err := c.to.Update("xDS "+c.cfg.Server+" version "+resp.GetVersionInfo(), load)
	c.firstOnce.Do(func() { close(c.first) })
	if err != nil {
		c.refused, c.refusedErr = key, err
		return c.request(TypeURL, *accepted, resp.GetNonce(), nack(err.Error())), true
	}
	c.refusedErr = nil
	*accepted = resp.GetVersionInfo()
	return c.request(TypeURL, *accepted, resp.GetNonce(), nil), true
}

func (c *Client) request(typeURL, version, nonce string, detail *rpcstatus.Status) *discovery.DiscoveryRequest {
	return &discovery.DiscoveryRequest{Node: c.node, TypeUrl: typeURL, VersionInfo: version, ResponseNonce: nonce, ErrorDetail: detail}
}

// nack is a NACK's error detail.
func nack(msg string) *rpcstatus.Status {
	if len(msg) > maxNackMessage {
		msg = strings.ToValidUTF8(msg[:maxNackMessage], "") + " …"
	}
	return &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: msg}
}

// digest identifies a response's resources: the same again, byte for
// byte, is the same response whatever its version and nonce.
func digest(resources []*anypb.Any) [sha256.Size]byte {
	h := sha256.New()
	var n [8]byte
	for _, a := range resources {
		for _, s := range [][]byte{[]byte(a.GetTypeUrl()), a.GetValue()} {
			binary.BigEndian.PutUint64(n[:], uint64(len(s)))
			h.Write(n[:])
			h.Write(s)
		}
	}
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// sleep waits d, or until ctx ends (false).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func errText(err error) string {
	if err == nil {
		return "the server ended the stream"
	}
	return err.Error()
}
