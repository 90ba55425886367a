package redisstore

import (
	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/store/redisurl"
)

// NewClient returns a go-redis client for rawURL, the deployment said by
// its scheme:
//
//	redis://[user:password@]host:6379[/db][?option=value&...]    one server
//	rediss://...                                                 one server, TLS
//	redis+sentinel://[user:password@]sentinel1:26379?master_name=mymaster&addr=sentinel2:26379[&password=...]
//	rediss+sentinel://...                                        Sentinel, TLS
//	redis+cluster://[user:password@]node1:7000?addr=node2:7001&addr=node3:7002
//	rediss+cluster://...                                         Cluster, TLS
//
// For Sentinel, the user and password in the URL are the sentinels' own;
// the master's are the username and password options (go-redis's
// convention). Options are go-redis's, in snake case (dial_timeout,
// pool_size, ...). The client ends each call at its context's deadline
// (ContextTimeoutEnabled), so a store call's deadline bounds it, and its
// errors never contain a credential from the URL.
//
// It is a convenience for programs configured by URL: New takes any
// redis.UniversalClient, however it was made.
func NewClient(rawURL string) (redis.UniversalClient, error) {
	return redisurl.NewClient(rawURL)
}
