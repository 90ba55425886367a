package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/internal/service/xds"
)

// xdsHeadersVar is the variable the xDS stream's headers come from, in
// envoy mode and out of it: never a flag, for they are credentials as a
// rule, and a command line is there for every local user to read.
const xdsHeadersVar = "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"

// xdsFlags are serve's flags for rules over xDS: envoyproxy/ratelimit's
// CONFIG_TYPE=GRPC_XDS_SOTW and its CONFIG_GRPC_XDS_* and
// XDS_CLIENT_* variables (envoyenv.go).
type xdsFlags struct {
	server, nodeID, nodeMetadata string
	tls                          bool
	cert, key, ca, serverName    string
	backoff                      xds.Backoff
	maxMessage                   int
	forceStart                   bool

	client *xds.Client // made by setup once the server is
}

func (x *xdsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&x.server, "xds", "", "take the rules from this xDS management server (host:port) instead of --config: RateLimitConfig resources over ADS, State of the World, as Envoy Gateway pushes them (envoy's CONFIG_TYPE=GRPC_XDS_SOTW and CONFIG_GRPC_XDS_SERVER_URL); the stream's headers come from $"+xdsHeadersVar)
	fs.StringVar(&x.nodeID, "xds-node-id", "default", "the node id the management server keeps the rules under (envoy's CONFIG_GRPC_XDS_NODE_ID; Envoy Gateway's is envoy-ratelimit)")
	fs.StringVar(&x.nodeMetadata, "xds-node-metadata", "", "the node's metadata, key=value,key=value (envoy's CONFIG_GRPC_XDS_NODE_METADATA)")
	fs.BoolVar(&x.tls, "xds-tls", false, "speak TLS to the management server (envoy's CONFIG_GRPC_XDS_SERVER_USE_TLS)")
	fs.StringVar(&x.cert, "xds-tls-cert", "", "with --xds-tls: the client certificate shown to the management server, PEM (envoy's CONFIG_GRPC_XDS_CLIENT_TLS_CERT)")
	fs.StringVar(&x.key, "xds-tls-key", "", "with --xds-tls: its key, PEM (envoy's CONFIG_GRPC_XDS_CLIENT_TLS_KEY)")
	fs.StringVar(&x.ca, "xds-tls-ca", "", "with --xds-tls: the CA the management server's certificate must chain to, PEM, instead of the system's (envoy's CONFIG_GRPC_XDS_SERVER_TLS_CACERT)")
	fs.StringVar(&x.serverName, "xds-tls-server-name", "", "with --xds-tls: the name the management server's certificate must hold, instead of the --xds host (envoy's CONFIG_GRPC_XDS_SERVER_TLS_SAN)")
	d := xds.DefaultBackoff
	fs.DurationVar(&x.backoff.Initial, "xds-backoff-initial", d.Initial, "the wait before reconnecting to the management server, doubled after each failure in a row (envoy's XDS_CLIENT_BACKOFF_INITIAL_INTERVAL)")
	fs.DurationVar(&x.backoff.Max, "xds-backoff-max", d.Max, "the longest wait before reconnecting (envoy's XDS_CLIENT_BACKOFF_MAX_INTERVAL)")
	fs.Float64Var(&x.backoff.RandomFactor, "xds-backoff-random-factor", d.RandomFactor, "with --xds-backoff-jitter, each wait is drawn within ± this share of itself (envoy's XDS_CLIENT_BACKOFF_RANDOM_FACTOR)")
	fs.BoolVar(&x.backoff.Jitter, "xds-backoff-jitter", d.Jitter, "spread the waits at random (envoy's XDS_CLIENT_BACKOFF_JITTER)")
	fs.IntVar(&x.maxMessage, "xds-max-message-bytes", 0, "the largest response taken from the management server; 0 is gRPC's 4 MiB (envoy's XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES)")
	fs.BoolVar(&x.forceStart, "xds-force-start", false, "serve before the first rules have come: /healthcheck answers, requests fail with gRPC Unknown until then (envoy's FORCE_START_WITHOUT_INITIAL_CONFIG); without it, serve listens once the first response is handled")
}

// check refuses flags of xDS without --xds, and values out of range.
func (x *xdsFlags) check() error {
	if x.server == "" {
		return nil
	}
	if !x.tls {
		for _, f := range []struct{ name, v string }{{"--xds-tls-cert", x.cert}, {"--xds-tls-key", x.key}, {"--xds-tls-ca", x.ca}, {"--xds-tls-server-name", x.serverName}} {
			if f.v != "" {
				return fmt.Errorf("%s is for --xds-tls", f.name)
			}
		}
	}
	switch {
	case x.backoff.Initial <= 0 || x.backoff.Max < x.backoff.Initial:
		return fmt.Errorf("--xds-backoff-initial %v, --xds-backoff-max %v: want 0 < initial ≤ max", x.backoff.Initial, x.backoff.Max)
	case x.backoff.RandomFactor < 0 || x.backoff.RandomFactor > 1:
		return fmt.Errorf("--xds-backoff-random-factor %v: want 0 to 1", x.backoff.RandomFactor)
	case x.maxMessage < 0:
		return fmt.Errorf("--xds-max-message-bytes %d: want 0 or more", x.maxMessage)
	}
	return nil
}

// newXDSClient makes the client that keeps srv's rules those of the
// management server; store names srv's store, for the log.
func (f *serveFlags) newXDSClient(getenv env, srv *service.Server, log *slog.Logger, store string) error {
	x := &f.xds
	if err := x.check(); err != nil {
		return err
	}
	headers, err := xds.ParseHeaders(getenv(xdsHeadersVar))
	if err != nil {
		return fmt.Errorf("%s: %w", xdsHeadersVar, err)
	}
	md, ignored := xds.ParseNodeMetadata(x.nodeMetadata)
	if len(ignored) > 0 {
		log.Warn("node metadata entries without '=' are left out, as envoy leaves them out", "entries", strings.Join(ignored, ","))
	}
	cfg := xds.Config{Server: x.server, NodeID: x.nodeID, NodeMetadata: md, Headers: headers, Backoff: x.backoff,
		MaxMessageBytes: x.maxMessage, Limits: f.rulesFiles.limits, Merge: f.rulesFiles.merge, Log: log, LogEvery: f.logInterval}
	if x.tls {
		cfg.TLS = &xds.TLSFiles{Cert: x.cert, Key: x.key, CA: x.ca, ServerName: x.serverName}
	}
	if x.client, err = xds.New(cfg, srv); err != nil {
		return err
	}
	names := make([]string, 0, len(headers))
	for k := range headers {
		names = append(names, k)
	}
	slices.Sort(names)
	log.Info("rules over xDS", "server", x.server, "node_id", x.nodeID, "tls", x.tls, "client_certificate", x.cert != "",
		"headers", strings.Join(names, ","), "force_start", x.forceStart, "store", store)
	return nil
}

// awaitFirst waits, unless --xds-force-start, for the first response of
// the management server to be handled, as envoyproxy/ratelimit waits
// before it listens. It reports false when ctx ended first.
func (x *xdsFlags) awaitFirst(ctx context.Context, log *slog.Logger) bool {
	if x.client == nil || x.forceStart {
		return true
	}
	log.Info("waiting for the first response of the xDS management server before listening (--xds-force-start serves at once)")
	select {
	case <-x.client.FirstResponse():
		return true
	case <-ctx.Done():
		log.Info("stopped before the first rules came")
		return false
	}
}

// errConfigAndXDS refuses rules from two places.
var errConfigAndXDS = errors.New("--config and --xds: the rules come from files or from a management server, not both")
