package ruleset

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Key says whom a rule counts a request of type Req against. Transports
// make their keys from ValueKey, FuncKey, GlobalKey and CompositeKey, so
// every key is namespaced, composed and hashed the same way: the store key
// is "<rule>:<kind>:<value>", a composite's value is its parts each
// prefixed by its length and ':' (appendPart), and a value too long for a
// store is replaced by its SHA-256 (see internal/storekey).
type Key[Req any] struct {
	kind  string
	user  bool // kind chosen by the user: checked
	value func(dst []byte, req Req) ([]byte, bool)
	parts []Key[Req]
	err   error
}

// ValueKey keys requests by what value appends to dst; kind names it in
// store keys and is the transport's own ("ip", "header=X-Api-Key"). When
// value returns false the request is not counted by the rule.
func ValueKey[Req any](kind string, value func(dst []byte, req Req) ([]byte, bool)) Key[Req] {
	return Key[Req]{kind: kind, value: value}
}

// FuncKey keys requests by what f returns: the authenticated user, the
// tenant. kind, chosen by the user, names it in store keys: 1 to 32
// characters without ':', '+', '=', spaces or quotes, so that it cannot
// collide with a transport's kinds. When f returns false the request is
// not counted.
func FuncKey[Req any](kind string, f func(Req) (string, bool)) Key[Req] {
	k := Key[Req]{kind: kind, user: true}
	if f == nil {
		k.err = fmt.Errorf("key %q has no function", kind)
		return k
	}
	k.value = func(dst []byte, req Req) ([]byte, bool) {
		v, ok := f(req)
		return append(dst, v...), ok
	}
	return k
}

// GlobalKey counts every request a rule matches against one key.
func GlobalKey[Req any]() Key[Req] {
	return Key[Req]{kind: "all", value: func(dst []byte, _ Req) ([]byte, bool) { return dst, true }}
}

// CompositeKey keys requests by all of parts together; a request missing
// any part is not counted. Parts do not nest.
func CompositeKey[Req any](parts ...Key[Req]) Key[Req] {
	return Key[Req]{parts: parts}
}

// BadKey is a key that makes NewRules fail with err: for a transport's key
// constructor given an unusable argument.
func BadKey[Req any](err error) Key[Req] { return Key[Req]{err: err} }

func (k Key[Req]) isZero() bool { return k.kind == "" && k.parts == nil && k.err == nil }

func (k Key[Req]) orDefault(def Key[Req]) Key[Req] {
	if k.isZero() {
		return def
	}
	if k.parts != nil {
		parts := make([]Key[Req], len(k.parts))
		for i, p := range k.parts {
			parts[i] = p.orDefault(def)
		}
		k.parts = parts
	}
	return k
}

func (k *Key[Req]) kindName() string {
	if k.parts == nil {
		return k.kind
	}
	names := make([]string, len(k.parts))
	for i := range k.parts {
		names[i] = k.parts[i].kindName()
	}
	return strings.Join(names, "+")
}

func (k *Key[Req]) check() error {
	switch {
	case k.err != nil:
		return k.err
	case k.parts != nil:
		if len(k.parts) < 2 {
			return errors.New("a composite key needs at least two parts")
		}
		for i := range k.parts {
			if k.parts[i].parts != nil {
				return errors.New("composite keys do not nest")
			}
			if err := k.parts[i].check(); err != nil {
				return err
			}
		}
	case k.user:
		if k.kind == "" || len(k.kind) > 32 || strings.ContainsAny(k.kind, ":+= \t\"") {
			return fmt.Errorf("key kind %q: want 1 to 32 characters without ':', '+', '=', spaces or quotes", k.kind)
		}
	case k.value == nil:
		return fmt.Errorf("key %q has no value", k.kind)
	}
	return nil
}

// appendValue appends the key's value for req to dst; false when req has
// none.
func (k *Key[Req]) appendValue(dst []byte, req Req) ([]byte, bool) {
	if k.parts == nil {
		return k.value(dst, req)
	}
	for i := range k.parts {
		start := len(dst)
		var ok bool
		if dst, ok = k.parts[i].appendValue(dst, req); !ok {
			return dst, false
		}
		dst = appendPart(dst, start)
	}
	return dst, true
}

// appendPart finishes one part of a composite key: dst[start:] holds the
// part's value, just appended, and appendPart rewrites it as the value's
// length in decimal, ':', then the value. The length is never clamped, and
// the terminator ends it, so the encoding of a tuple of parts is
// unambiguous whatever the parts hold or how long they are: no two
// different tuples spell the same key. It moves the value in place, and
// allocates only when dst lacks room for the length.
func appendPart(dst []byte, start int) []byte {
	var digits [20]byte
	n := strconv.AppendInt(digits[:0], int64(len(dst)-start), 10)
	shift := len(n) + 1
	for range shift {
		dst = append(dst, 0)
	}
	copy(dst[start+shift:], dst[start:len(dst)-shift])
	copy(dst[start:], n)
	dst[start+len(n)] = ':'
	return dst
}
