package httplimit

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/tollgate/tollgate/internal/door/ruleset"
)

// Key says whom a rule counts a request against: the client's address (the
// zero Key), a header such as an API key, the authenticated user or tenant,
// the route, everyone together, or a composite of these.
//
// The store key a request spends is namespaced as
//
//	<rule>:<kind>:<value>
//
// so two rules, or an API key and an IP address that happen to be spelled
// alike, never share a counter. A composite's value is its parts, each
// prefixed by its length and ':', so no two tuples of parts spell the same
// key. A value that would make the key longer than tollgate.MaxKeyLen is
// replaced by its SHA-256, as "<rule>:<kind>#<hex>": a client cannot escape
// a limit by sending a huge header, nor reach a hashed key's counter by
// sending the hash as its own value.
type Key struct{ k ruleset.Key[call] }

// ClientIP keys requests by client address, as the Limiter's
// clientip.Resolver finds it (enforce.WithClientIP): the peer address unless
// trusted proxies are configured; IPv6 grouped by /64. It is the zero Key.
func ClientIP() Key {
	return Key{ruleset.ValueKey("ip", func(dst []byte, c call) ([]byte, bool) {
		a := c.ips.Addr(c.r)
		if !a.IsValid() {
			// Not an IP peer (a Unix socket): all such requests share one key.
			return append(dst, c.r.RemoteAddr...), true
		}
		return c.ips.AppendKey(dst, a), true
	})}
}

// Header keys requests by the value of header name, such as "X-API-Key".
// A request without it is not counted by the rule: pair such a rule with a
// ClientIP rule for anonymous traffic.
func Header(name string) Key {
	name = http.CanonicalHeaderKey(name)
	if name == "" || len(name) > 64 || strings.ContainsAny(name, ": \t") {
		return Key{ruleset.BadKey[call](fmt.Errorf("header key %q: want a header name of 1 to 64 characters", name))}
	}
	return Key{ruleset.ValueKey("header="+name, func(dst []byte, c call) ([]byte, bool) {
		vs := c.r.Header[name]
		if len(vs) == 0 || vs[0] == "" {
			return dst, false
		}
		return append(dst, vs[0]...), true
	})}
}

// Func keys requests by what f returns: the authenticated user, the tenant,
// the plan's account. kind names it in the store key ("user", "tenant"): 1
// to 32 characters without ':', '+', '=', spaces or quotes. When f returns
// false the request is not counted by the rule.
func Func(kind string, f func(*http.Request) (string, bool)) Key {
	var fc func(call) (string, bool)
	if f != nil {
		fc = func(c call) (string, bool) { return f(c.r) }
	}
	return Key{ruleset.FuncKey(kind, fc)}
}

// Route keys requests by method and path ("GET /users/42"): each resource
// gets its own allowance.
func Route() Key {
	return Key{ruleset.ValueKey("route", func(dst []byte, c call) ([]byte, bool) {
		dst = append(dst, c.r.Method...)
		dst = append(dst, ' ')
		return append(dst, c.r.URL.Path...), true
	})}
}

// Global counts every request the rule matches against one key: a limit on
// an endpoint as a whole.
func Global() Key { return Key{ruleset.GlobalKey[call]()} }

// Composite keys requests by all of keys together, such as tenant and
// route. A request missing any part is not counted by the rule.
func Composite(keys ...Key) Key {
	parts := make([]ruleset.Key[call], len(keys))
	for i, k := range keys {
		parts[i] = k.k
	}
	return Key{ruleset.CompositeKey(parts...)}
}
