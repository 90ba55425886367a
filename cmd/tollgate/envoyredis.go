package main

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// envoyRedisURL builds the --redis URL from REDIS_URL and its companions.
// REDIS_AUTH's password stays out of it (see envoyRedisEnv); REDIS_URL
// unset leaves --redis alone.
func envoyRedisURL(e envoyEnv) (string, bool, error) {
	raw := e.getenv("REDIS_URL")
	if raw == "" {
		return "", false, nil
	}
	if strings.Contains(raw, "://") {
		return raw, true, nil // tollgate's own URL form
	}
	if st := strings.ToLower(e.get("REDIS_SOCKET_TYPE")); st != "tcp" {
		return "", false, envoyErrorf("REDIS_SOCKET_TYPE", e.get("REDIS_SOCKET_TYPE"), "tollgate reaches Redis over TCP only; set REDIS_SOCKET_TYPE=tcp and REDIS_URL=host:port")
	}
	tls, err := e.boolean("REDIS_TLS")
	if err != nil {
		return "", false, err
	}
	q := url.Values{}
	if e.set("REDIS_POOL_SIZE") {
		if n, err := strconv.Atoi(e.get("REDIS_POOL_SIZE")); err != nil || n <= 0 {
			return "", false, envoyErrorf("REDIS_POOL_SIZE", e.get("REDIS_POOL_SIZE"), "want a positive whole number")
		}
	}
	q.Set("pool_size", e.get("REDIS_POOL_SIZE"))
	d, err := time.ParseDuration(e.get("REDIS_TIMEOUT"))
	if err != nil || d < 0 {
		return "", false, envoyErrorf("REDIS_TIMEOUT", e.get("REDIS_TIMEOUT"), "want a duration such as 10s")
	}
	q.Set("dial_timeout", d.String())
	user, _, hasUser := strings.Cut(e.getenv("REDIS_AUTH"), ":")
	u := &url.URL{Scheme: "redis"}
	if tls {
		u.Scheme = "rediss"
	}
	addrs := strings.Split(raw, ",")
	all := len(addrs) // REDIS_URL's comma-separated parts, a master name among them
	switch typ := strings.ToLower(e.get("REDIS_TYPE")); typ {
	case "single":
		if len(addrs) != 1 {
			return "", false, envoyErrorf("REDIS_URL", raw, "REDIS_TYPE SINGLE wants one host:port, not %d", len(addrs))
		}
	case "cluster":
		u.Scheme += "+cluster"
	case "sentinel":
		if len(addrs) < 2 {
			return "", false, envoyErrorf("REDIS_URL", raw, "REDIS_TYPE SENTINEL wants master-name,host:port[,host:port…]")
		}
		u.Scheme += "+sentinel"
		q.Set("master_name", addrs[0])
		addrs = addrs[1:]
		if hasUser {
			q.Set("username", user) // the master's; the user information is the sentinels'
		}
		hasUser = false
		if sa := e.getenv("REDIS_SENTINEL_AUTH"); sa != "" {
			su, sp, ok := strings.Cut(sa, ":")
			if ok {
				u.User = url.UserPassword(su, sp)
			} else {
				u.User = url.UserPassword("", sa)
			}
		}
	default:
		return "", false, envoyErrorf("REDIS_TYPE", e.get("REDIS_TYPE"), "want SINGLE, SENTINEL or CLUSTER")
	}
	for i, a := range addrs {
		if !isHostPort(a) {
			return "", false, envoyErrorf("REDIS_URL", raw, "%s", notHostPort(all-len(addrs)+i, all, a))
		}
	}
	if hasUser && user != "" {
		u.User = url.User(user)
	}
	u.Host = addrs[0]
	for _, a := range addrs[1:] {
		q.Add("addr", a)
	}
	u.RawQuery = q.Encode()
	return u.String(), true, nil
}

// isHostPort reports whether addr is a host (a name, or an IP address,
// IPv6 in brackets) and a port number from 1 to 65535: what a Redis URL's
// host takes, so that no other text, a password mistaken for a port
// among it, reaches the URL and the errors that quote it.
func isHostPort(addr string) bool {
	host, port, err := net.SplitHostPort(addr)
	hostRune := func(r rune) bool {
		return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(".-_:%", r)
	}
	if err != nil || host == "" || strings.ContainsFunc(host, func(r rune) bool { return !hostRune(r) }) {
		return false
	}
	n, err := strconv.Atoi(port)
	return err == nil && n >= 1 && n <= 65535 && strconv.Itoa(n) == port
}

// notHostPort says which of REDIS_URL's n comma-separated parts, the
// i-th (from 0), is no host:port, without quoting it: REDIS_URL can hold
// user information.
func notHostPort(i, n int, addr string) string {
	what := "it is no host:port"
	if n > 1 {
		what = fmt.Sprintf("part %d of %d (comma-separated) is no host:port", i+1, n)
	}
	if strings.Contains(addr, "@") {
		what += "; a password goes in REDIS_AUTH (or --redis-password-file), not in REDIS_URL"
	}
	return what
}

// envoyRedisEnv is the environment resolveRedis reads: in envoy mode
// REDIS_AUTH may be envoy's "user:password", whose user name envoyRedisURL
// put into the URL, so only the password is passed on; elsewhere it is
// getenv itself.
func envoyRedisEnv(getenv env) env {
	if !envoyModeOn(getenv) {
		return getenv
	}
	return func(name string) string {
		v := getenv(name)
		if name == "REDIS_AUTH" {
			if _, pw, ok := strings.Cut(v, ":"); ok {
				return pw
			}
		}
		return v
	}
}
