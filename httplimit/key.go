package httplimit

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/tollgate/tollgate/clientip"
	"github.com/tollgate/tollgate/enforce"
)

type keyKind uint8

const (
	kindClientIP keyKind = iota // the zero Key
	kindHeader
	kindFunc
	kindRoute
	kindGlobal
	kindComposite
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
type Key struct {
	kind  keyKind
	name  string // the header's canonical name, or Func's kind
	fn    func(*http.Request) (string, bool)
	parts []Key
}

// ClientIP keys requests by client address, as the Limiter's
// clientip.Resolver finds it (WithClientIP): the peer address unless
// trusted proxies are configured; IPv6 grouped by /64. It is the zero Key.
func ClientIP() Key { return Key{} }

// Header keys requests by the value of header name, such as "X-API-Key".
// A request without it is not counted by the rule: pair such a rule with a
// ClientIP rule for anonymous traffic.
func Header(name string) Key {
	return Key{kind: kindHeader, name: http.CanonicalHeaderKey(name)}
}

// Func keys requests by what f returns: the authenticated user, the tenant,
// the plan's account. kind names it in the store key ("user", "tenant"). When
// f returns false the request is not counted by the rule.
func Func(kind string, f func(*http.Request) (string, bool)) Key {
	return Key{kind: kindFunc, name: kind, fn: f}
}

// Route keys requests by method and path ("GET /users/42"): each resource
// gets its own allowance.
func Route() Key { return Key{kind: kindRoute} }

// Global counts every request the rule matches against one key: a limit on
// an endpoint as a whole.
func Global() Key { return Key{kind: kindGlobal} }

// Composite keys requests by all of keys together, such as tenant and
// route. A request missing any part is not counted by the rule.
func Composite(keys ...Key) Key {
	return Key{kind: kindComposite, parts: keys}
}

// kindName is how the key's kind is spelled in store keys.
func (k *Key) kindName() string {
	switch k.kind {
	case kindClientIP:
		return "ip"
	case kindHeader:
		return "header=" + k.name
	case kindFunc:
		return k.name
	case kindRoute:
		return "route"
	case kindGlobal:
		return "all"
	}
	names := make([]string, len(k.parts))
	for i := range k.parts {
		names[i] = k.parts[i].kindName()
	}
	return strings.Join(names, "+")
}

func (k *Key) check() error {
	switch k.kind {
	case kindHeader:
		if k.name == "" || len(k.name) > 64 || strings.ContainsAny(k.name, ": \t") {
			return fmt.Errorf("httplimit: header key %q: want a header name of 1 to 64 characters", k.name)
		}
	case kindFunc:
		if k.fn == nil {
			return fmt.Errorf("httplimit: key %q has no function", k.name)
		}
		if k.name == "" || len(k.name) > 32 || strings.ContainsAny(k.name, ":+= \t\"") {
			return fmt.Errorf("httplimit: key kind %q: want 1 to 32 characters without ':', '+', '=', spaces or quotes", k.name)
		}
	case kindComposite:
		if len(k.parts) < 2 {
			return fmt.Errorf("httplimit: a composite key needs at least two parts")
		}
		for i := range k.parts {
			if k.parts[i].kind == kindComposite {
				return fmt.Errorf("httplimit: composite keys do not nest")
			}
			if err := k.parts[i].check(); err != nil {
				return err
			}
		}
	}
	return nil
}

// appendValue appends the key's value for r to dst; false when r has none.
func (k *Key) appendValue(dst []byte, r *http.Request, ips *clientip.Resolver) ([]byte, bool) {
	switch k.kind {
	case kindClientIP:
		a := ips.Addr(r)
		if !a.IsValid() {
			// Not an IP peer (a Unix socket): all such requests share one key.
			return append(dst, r.RemoteAddr...), true
		}
		return ips.AppendKey(dst, a), true
	case kindHeader:
		vs := r.Header[k.name]
		if len(vs) == 0 || vs[0] == "" {
			return dst, false
		}
		return append(dst, vs[0]...), true
	case kindFunc:
		v, ok := k.fn(r)
		if !ok {
			return dst, false
		}
		return append(dst, v...), true
	case kindRoute:
		dst = append(dst, r.Method...)
		dst = append(dst, ' ')
		return append(dst, r.URL.Path...), true
	case kindGlobal:
		return dst, true
	}
	// Composite: each part's value prefixed by its length and ':', so that
	// no two different tuples spell the same key (enforce.AppendPart).
	for i := range k.parts {
		start := len(dst)
		var ok bool
		dst, ok = k.parts[i].appendValue(dst, r, ips)
		if !ok {
			return dst, false
		}
		dst = enforce.AppendPart(dst, start)
	}
	return dst, true
}

// storeKey builds the namespaced store key for r in buf: prefix ("rule:kind:")
// then the value, hashed when too long.
func storeKey(buf []byte, prefix string, k *Key, r *http.Request, ips *clientip.Resolver) (string, bool) {
	b := append(buf[:0], prefix...)
	b, ok := k.appendValue(b, r, ips)
	if !ok {
		return "", false
	}
	return enforce.KeyString(b, len(prefix)), true
}
