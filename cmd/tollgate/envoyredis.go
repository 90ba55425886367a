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
		return "", false, fmt.Errorf("REDIS_SOCKET_TYPE=%q: tollgate reaches Redis over TCP only; set REDIS_SOCKET_TYPE=tcp and REDIS_URL=host:port", e.get("REDIS_SOCKET_TYPE"))
	}
	tls, err := e.boolean("REDIS_TLS")
	if err != nil {
		return "", false, err
	}
	q := url.Values{}
	if e.set("REDIS_POOL_SIZE") {
		if n, err := strconv.Atoi(e.get("REDIS_POOL_SIZE")); err != nil || n <= 0 {
			return "", false, fmt.Errorf("REDIS_POOL_SIZE=%q: want a positive whole number", e.get("REDIS_POOL_SIZE"))
		}
	}
	q.Set("pool_size", e.get("REDIS_POOL_SIZE"))
	d, err := time.ParseDuration(e.get("REDIS_TIMEOUT"))
	if err != nil || d < 0 {
		return "", false, fmt.Errorf("REDIS_TIMEOUT=%q: want a duration such as 10s", e.get("REDIS_TIMEOUT"))
	}
	q.Set("dial_timeout", d.String())
	user, _, hasUser := strings.Cut(e.getenv("REDIS_AUTH"), ":")
	u := &url.URL{Scheme: "redis"}
	if tls {
		u.Scheme = "rediss"
	}
	addrs := strings.Split(raw, ",")
	switch typ := strings.ToLower(e.get("REDIS_TYPE")); typ {
	case "single":
		if len(addrs) != 1 {
			return "", false, fmt.Errorf("REDIS_URL=%q: REDIS_TYPE SINGLE wants one host:port", raw)
		}
	case "cluster":
		u.Scheme += "+cluster"
	case "sentinel":
		if len(addrs) < 2 {
			return "", false, fmt.Errorf("REDIS_URL=%q: REDIS_TYPE SENTINEL wants master-name,host:port[,host:port…]", raw)
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
		return "", false, fmt.Errorf("REDIS_TYPE=%q: want SINGLE, SENTINEL or CLUSTER", e.get("REDIS_TYPE"))
	}
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return "", false, fmt.Errorf("REDIS_URL=%q: %q is no host:port", raw, a)
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
