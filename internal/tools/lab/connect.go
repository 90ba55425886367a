package lab

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/test/redistest"
)

// DefaultURL is the Redis the demos use when REDIS_URL is empty.
const DefaultURL = "redis://127.0.0.1:6379"

// probeTimeout bounds the PING that decides whether a Redis answers at the
// given URL: a local server answers in well under a millisecond.
const probeTimeout = time.Second

// Redis is the server the demos talk to: the one at the URL they were given,
// or a throwaway redis-server started because nothing answered there.
type Redis struct {
	// Client is connected to the server, with context deadlines enabled.
	Client *redis.Client
	// URL is the server's address, for processes the demos start.
	URL string
	// Throwaway reports whether the server was started by Connect (and is
	// stopped by Close).
	Throwaway bool

	server *redistest.Server
}

// Connect returns a connection to the Redis at url (DefaultURL when empty).
// When nothing answers there — the connection is refused or times out — it
// starts a throwaway redis-server on a free loopback port instead, so the
// lab works on a machine where only the redis-server binary is installed;
// Close stops it. A server that accepts the connection but fails PING (a
// wrong password, a bad database) is an error, not a reason to start
// another one. Connect
// says on log which server it uses.
//
// The throwaway server is started by internal/test/redistest, the package the
// tests use: it keeps no data on disk, listens on 127.0.0.1 only and, on
// Linux, dies with this process even if it is killed.
func Connect(ctx context.Context, url string, log io.Writer) (*Redis, error) {
	if url == "" {
		url = DefaultURL
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("lab: REDIS_URL %q: %w", url, err)
	}
	opt.ContextTimeoutEnabled = true
	// Dial first: go-redis retries a refused connection several times and
	// logs each failure, which is noise when nothing is expected there.
	d := net.Dialer{Timeout: probeTimeout}
	conn, err := d.DialContext(ctx, opt.Network, opt.Addr)
	if err == nil {
		_ = conn.Close()
		rdb := redis.NewClient(opt)
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		err = rdb.Ping(pctx).Err()
		cancel()
		if err != nil {
			_ = rdb.Close()
			return nil, fmt.Errorf("lab: Redis at %s: %w", url, err)
		}
		fmt.Fprintf(log, "lab: using the Redis at %s\n", url)
		return &Redis{Client: rdb, URL: url}, nil
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("lab: Redis at %s: %w", url, ctx.Err())
	}

	srv, serr := redistest.StartServer()
	if serr != nil {
		return nil, fmt.Errorf("lab: nothing answers at %s (%v), and starting a throwaway redis-server failed: %w", url, err, serr)
	}
	fmt.Fprintf(log, "lab: nothing answers at %s; started a throwaway redis-server at %s (stopped when done)\n", url, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	return &Redis{Client: rdb, URL: srv.URL(), Throwaway: true, server: srv}, nil
}

// Close closes the client and stops the throwaway server, if there is one.
func (r *Redis) Close() {
	_ = r.Client.Close()
	if r.server != nil {
		r.server.Close()
	}
}
