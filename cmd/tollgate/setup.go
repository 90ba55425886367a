package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/internal/service/config"
	"github.com/tollgate/tollgate/internal/store/redisurl"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/redisstore"
)

// setup builds the logger, the store and the server from the flags, loads
// the rules, and returns a cleanup function.
func (f *serveFlags) setup(getenv env, stderr io.Writer) (*service.Server, *slog.Logger, func(), error) {
	log, err := f.logger(stderr)
	if err != nil {
		return nil, nil, nil, err
	}
	switch {
	case f.config == "" && f.xds.server == "":
		return nil, nil, nil, errors.New("--config is required: a rules file or directory (see examples/ratelimit.yaml), or --xds, a management server")
	case f.config != "" && f.xds.server != "":
		return nil, nil, nil, errConfigAndXDS
	}
	opts, err := f.serverOptions()
	if err != nil {
		return nil, nil, nil, err
	}
	statsOpts, err := f.extra.stats.options(log)
	if err != nil {
		return nil, nil, nil, err
	}
	opts = append(opts, statsOpts...)
	var rules *config.Rules
	if f.config != "" {
		if rules, err = config.Load(f.config, f.rulesFiles.options()...); err != nil {
			return nil, nil, nil, err
		}
	}
	target, err := resolveRedis(f.redis, f.redisPwFile, envoyRedisEnv(getenv))
	if err != nil {
		return nil, nil, nil, err
	}
	if target.tls, err = f.redisTLS.options(target.url, log, f.logInterval); err != nil {
		return nil, nil, nil, err
	}
	tuneGC(getenv, target.url == "", log)
	store, err := f.store(target, log)
	if err != nil {
		return nil, nil, nil, err
	}
	timeout := f.timeout
	if target.url == "" {
		// The memory store never waits on I/O (a decision takes a
		// microsecond), so a deadline would only cost a timer per request.
		timeout = 0
	}
	srv, err := service.New(store.Store, append(opts,
		service.WithTimeout(timeout), service.WithLogger(log), service.WithPing(store.ping), service.WithConcurrencyStore(store.conc),
		service.WithParallelDescriptors(store.ping != nil))...) // a remote store: one round trip per request
	if err != nil {
		store.cleanup()
		return nil, nil, nil, err
	}
	cleanup := func() { f.extra.stats.close(); store.cleanup() }
	if rules == nil {
		if err := f.newXDSClient(getenv, srv, log, store.name); err != nil {
			cleanup()
			return nil, nil, nil, err
		}
		return srv, log, cleanup, nil
	}
	srv.SetRules(rules)
	log.Info("rules loaded", "path", f.config, "files", len(rules.Files()), "domains", rules.Domains(), "rules", len(rules.All()), "store", store.name)
	return srv, log, cleanup, nil
}

// logger is the service's logger, as --log-level and --log-format say.
func (f *serveFlags) logger(stderr io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", f.logLevel)
	}
	switch f.logFormat {
	case "text":
		return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})), nil
	case "json":
		return slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level})), nil
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", f.logFormat)
	}
}

// serverOptions checks the flags that become server options (all but the
// timeout, which depends on the store) and returns those options.
func (f *serveFlags) serverOptions() ([]service.Option, error) {
	mode, err := enforce.ParseFailureMode(f.failureMode)
	if err != nil {
		return nil, fmt.Errorf("--failure-mode %q: want open or closed", f.failureMode)
	}
	flavor, err := headers.ParseFlavor(f.headers)
	if err != nil {
		return nil, fmt.Errorf("--headers %q: want draft, ratelimit, x-ratelimit, all or none", f.headers)
	}
	if f.timeout <= 0 {
		return nil, fmt.Errorf("--timeout %v: want a positive duration", f.timeout)
	}
	if f.failRetry <= 0 {
		return nil, fmt.Errorf("--fail-closed-retry-after %v: want a positive duration", f.failRetry)
	}
	if f.logInterval < 0 {
		return nil, fmt.Errorf("--log-interval %v: want a duration of 0 or more", f.logInterval)
	}
	bounds, err := f.bounds.options()
	if err != nil {
		return nil, err
	}
	envoy, err := f.envoy.options()
	if err != nil {
		return nil, err
	}
	if err := f.rulesFiles.check(); err != nil {
		return nil, err
	}
	return append(append(bounds, envoy...), service.WithFailureMode(mode), service.WithFailClosedRetryAfter(f.failRetry), service.WithDryRun(f.shadow),
		service.WithLogInterval(f.logInterval), service.WithHeaders(flavor), service.WithLoadOptions(f.rulesFiles.options()...)), nil
}

// serveStore is the store serve decides with, and what goes with it.
type serveStore struct {
	tollgate.Store
	conc    tollgate.ConcurrencyStore   // the slots of concurrency rules
	name    string                      // "memory" or "redis", for the log
	ping    func(context.Context) error // nil for the memory store
	cleanup func()                      // closes the Redis client
}

// store makes the store of target: the embedded memory store when there
// is no Redis URL, else a Redis store whose scripts are preloaded.
func (f *serveFlags) store(target redisTarget, log *slog.Logger) (serveStore, error) {
	if target.url == "" {
		m := memorystore.New()
		return serveStore{Store: m, conc: m, name: "memory", cleanup: func() {}}, nil
	}
	// go-redis logs through the service's logger, sampled and redacted,
	// from its first connection on.
	redis.SetLogger(newRedisLogger(log, target.redact, f.logInterval))
	if target.fromArgv {
		log.Warn("the --redis URL holds a password, which every local user can read in the process list; use --redis-password-file or $REDIS_AUTH")
	}
	client, err := redisurl.NewClient(target.url, target.options()...)
	if err != nil {
		return serveStore{}, err
	}
	f.extra.stats.watchRedis(client)
	// --redis-pipeline 0 turns pipelining off, on every kind of client.
	rs := redisstore.New(client, redisstore.WithPipeline(f.pipeline, 64), redisstore.WithPrefix(f.redisPrefix))
	store := f.extra.withLocalCache(rs, log)
	// Preload the scripts; if Redis is not there yet, the first decisions
	// load them.
	lctx, cancel := context.WithTimeout(context.Background(), time.Second)
	if err := rs.Load(lctx); err != nil {
		log.Warn("redis not reachable at startup; serving by failure mode until it is", "error", target.redact.Redact(err.Error()))
	}
	cancel()
	return serveStore{
		Store:   store,
		conc:    rs,
		name:    "redis",
		ping:    func(ctx context.Context) error { return client.Ping(ctx).Err() },
		cleanup: func() { client.Close() },
	}, nil
}

// background starts what keeps a server current until ctx ends: the store
// probe, and the xDS client, or the file watch and SIGHUP reloads.
func (f *serveFlags) background(ctx context.Context, srv *service.Server, log *slog.Logger) {
	go srv.Probe(ctx, time.Second)
	if f.xds.client != nil {
		go f.xds.client.Run(ctx)
	} else if f.watch {
		go func() {
			if err := config.Watch(ctx, f.config, 0, func() { srv.Reload(f.config) }); err != nil {
				log.Error("cannot watch the rules; reload with SIGHUP", "error", err.Error())
			}
		}()
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				if f.xds.client != nil {
					log.Info("SIGHUP: the rules come from the xDS management server; nothing to reload")
					continue
				}
				log.Info("SIGHUP: reloading rules", "path", f.config)
				srv.Reload(f.config)
			}
		}
	}()
}
