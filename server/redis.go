package server

import (
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
			return nil, fmt.Errorf("server: redis URL %s: a Sentinel URL needs the master_name parameter", redact(url))
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
