package server

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// NewRedisClient returns a Redis client for url. The forms are go-redis's
// URL forms, with the scheme saying which kind of deployment it is:
//
//	redis://[user:password@]host:6379[/db][?option=value&...]    one server
//	rediss://...                                                 one server, TLS
//	redis+sentinel://[user:password@]sentinel1:26379?master_name=mymaster&addr=sentinel2:26379&addr=sentinel3:26379[&password=...]
//	rediss+sentinel://...                                        Sentinel, TLS
//	redis+cluster://[user:password@]node1:7000?addr=node2:7001&addr=node3:7002
//	rediss+cluster://...                                         Cluster, TLS
//
// For Sentinel, the user and password in the URL are the sentinels' own;
// the master's are the username and password options (go-redis's
// convention). Options are go-redis's, in snake case (dial_timeout,
// pool_size, ...). Every client has ContextTimeoutEnabled, so the server's
// deadline bounds each call.
func NewRedisClient(url string) (redis.UniversalClient, error) {
	scheme, rest, ok := strings.Cut(url, "://")
	if !ok {
		return nil, fmt.Errorf("server: redis URL %q has no scheme (want redis://, rediss://, redis+sentinel:// or redis+cluster://)", redact(url))
	}
	base, kind, _ := strings.Cut(scheme, "+")
	if base != "redis" && base != "rediss" {
		return nil, fmt.Errorf("server: redis URL scheme %q: want redis, rediss, redis+sentinel, rediss+sentinel, redis+cluster or rediss+cluster", scheme)
	}
	plain := base + "://" + rest
	switch kind {
	case "":
		o, err := redis.ParseURL(plain)
		if err != nil {
			return nil, fmt.Errorf("server: redis URL %s: %w", redact(url), err)
		}
		o.ContextTimeoutEnabled = true
		return redis.NewClient(o), nil
	case "sentinel":
		o, err := redis.ParseFailoverURL(plain)
		if err != nil {
			return nil, fmt.Errorf("server: redis URL %s: %w", redact(url), err)
		}
		if o.MasterName == "" {
			return nil, fmt.Errorf("server: redis URL %s: a Sentinel URL needs master_name=...", redact(url))
		}
		o.ContextTimeoutEnabled = true
		return redis.NewFailoverClient(o), nil
	case "cluster":
		o, err := redis.ParseClusterURL(plain)
		if err != nil {
			return nil, fmt.Errorf("server: redis URL %s: %w", redact(url), err)
		}
		o.ContextTimeoutEnabled = true
		return redis.NewClusterClient(o), nil
	}
	return nil, fmt.Errorf("server: redis URL scheme %q: want redis, rediss, redis+sentinel, rediss+sentinel, redis+cluster or rediss+cluster", scheme)
}

// redact hides the password of a URL in messages.
func redact(url string) string {
	scheme, rest, ok := strings.Cut(url, "://")
	if !ok {
		return url
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return url
	}
	user := rest[:at]
	if u, _, has := strings.Cut(user, ":"); has {
		user = u + ":xxxxx"
	}
	return scheme + "://" + user + rest[at:]
}

// Pipelined returns a client that sends the script calls of concurrent
// decisions to Redis together, in pipelines, through go-redis's
// autopipeliner, and a function that stops it (the client c itself is the
// caller's to close). Every call still waits no longer than its context
// allows: a caller whose deadline passes gets the context's error at once,
// while its command completes in the background. At most maxQueued commands
// wait for a pipeline; beyond that calls fail at once (and rules answer by
// their failure mode) rather than pile up behind a Redis that stopped
// answering.
//
// Only EVAL and EVALSHA are pipelined, which is all redisstore's decisions
// send; everything else (PING, SCRIPT LOAD) goes to c as usual.
func Pipelined(c redis.UniversalClient, maxQueued int) (redis.UniversalClient, func() error, error) {
	opts := redis.DefaultAutoPipelineOptions()
	opts.MaxQueuedCommands = maxQueued
	type asyncPipeliner interface {
		AsyncAutoPipelineWithOptions(*redis.AutoPipelineOptions) (*redis.AutoPipeliner, error)
	}
	a, ok := c.(asyncPipeliner)
	if !ok {
		return nil, nil, fmt.Errorf("server: %T cannot pipeline", c)
	}
	ap, err := a.AsyncAutoPipelineWithOptions(opts)
	if err != nil {
		return nil, nil, fmt.Errorf("server: pipeline: %w", err)
	}
	return pipelined{UniversalClient: c, ap: ap}, ap.Close, nil
}

type pipelined struct {
	redis.UniversalClient
	ap *redis.AutoPipeliner
}

// EvalSha queues EVALSHA on the pipeline and waits for it within ctx.
func (p pipelined) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return p.eval(ctx, "evalsha", sha1, keys, args)
}

// Eval queues EVAL on the pipeline and waits for it within ctx.
func (p pipelined) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return p.eval(ctx, "eval", script, keys, args)
}

func (p pipelined) eval(ctx context.Context, name, payload string, keys []string, args []any) *redis.Cmd {
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, name, payload, len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmdArgs = append(cmdArgs, args...)
	cmd := redis.NewCmd(ctx, cmdArgs...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3) // for Cluster routing, as go-redis's own Eval does
	}
	if err := p.ap.Submit(ctx, cmd).WaitContext(ctx); err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		// The command is still in flight and will write its result into
		// cmd: hand the caller a command of its own.
		late := redis.NewCmd(ctx, cmdArgs...)
		late.SetErr(err)
		return late
	}
	return cmd
}
