// Package clientip finds the address of the client behind an HTTP request,
// for keying rate limits by client, without letting the client choose it.
//
// # The model
//
// By default the client is the peer: the address the TCP connection came
// from (http.Request.RemoteAddr). Behind a proxy or load balancer the peer
// is the proxy, and the client's address is in a header the proxy set:
// X-Forwarded-For, Forwarded (RFC 7239) or X-Real-IP. Anyone can send those
// headers, so a Resolver reads them only when the peer is one of the
// configured trusted proxies, and then walks the list from the right — from
// the hop nearest to this server — skipping trusted proxies, and stops at
// the first address it does not trust: that is the client. Entries to its
// left were written by the client or by proxies nobody vouches for, so a
// spoofed header never changes the key:
//
//	X-Forwarded-For: 1.2.3.4, 203.0.113.7, 10.0.0.5     (peer 10.0.0.9)
//	                 spoofed  client       trusted       trusted
//
// Only the one header the proxies are configured to set is read (FromHeader;
// X-Forwarded-For by default). Reading several would be unsafe: a proxy that
// sets X-Forwarded-For usually passes a client's own Forwarded header
// through untouched.
//
// # Grouping
//
// One IPv6 user normally holds a whole /64 and can use a new address for
// every request, so keys group IPv6 addresses by /64 (GroupIPv6 changes it).
// IPv4 addresses are keyed whole (GroupIPv4 changes it). An IPv4-mapped IPv6
// address (::ffff:192.0.2.1) counts as the IPv4 address it maps.
package clientip

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// headerKind is how a header lists addresses.
type headerKind uint8

const (
	kindXFF       headerKind = iota // comma-separated addresses, nearest last
	kindForwarded                   // RFC 7239 elements with for= parameters
	kindSingle                      // one address (X-Real-IP and the like)
)

// Resolver finds the client address of requests. The zero value trusts no
// proxy: the client is always the peer, IPv6 grouped by /64. Build one with
// New to trust proxies. A Resolver is immutable and safe for concurrent use.
type Resolver struct {
	trusted []netip.Prefix
	header  string // canonical header name; "" means X-Forwarded-For
	kind    headerKind
	v4Bits  int // 0 means 32
	v6Bits  int // 0 means 64
}

// Option configures a Resolver. An option with an unusable argument makes
// New fail, naming it.
type Option func(*options)

// options are what the Options set: the Resolver being built, and the
// first unusable argument.
type options struct {
	r   Resolver
	err error
}

// fail records err unless an earlier option already failed.
func (o *options) fail(err error) {
	if o.err == nil {
		o.err = err
	}
}

// TrustProxies trusts the proxies in the given CIDR ranges ("10.0.0.0/8",
// "2001:db8::/32") or single addresses ("192.0.2.10"). Only a request whose
// peer is trusted has its forwarding header read.
func TrustProxies(cidrs ...string) Option {
	return func(o *options) {
		for _, c := range cidrs {
			c = strings.TrimSpace(c)
			var p netip.Prefix
			var err error
			if strings.Contains(c, "/") {
				p, err = netip.ParsePrefix(c)
			} else {
				var a netip.Addr
				a, err = netip.ParseAddr(c)
				p = netip.PrefixFrom(a, a.BitLen())
			}
			if err != nil {
				o.fail(fmt.Errorf("clientip: trusted proxy %q is not an address or CIDR range: %w", c, err))
				return
			}
			o.r.trusted = append(o.r.trusted, unmapPrefix(p))
		}
	}
}

// FromHeader names the header the trusted proxies set: "X-Forwarded-For"
// (the default), "Forwarded" (RFC 7239), or any header holding a single
// address, such as "X-Real-IP", "True-Client-IP" or "CF-Connecting-IP".
func FromHeader(name string) Option {
	return func(o *options) {
		name = http.CanonicalHeaderKey(strings.TrimSpace(name))
		if name == "" {
			o.fail(fmt.Errorf("clientip: empty header name"))
			return
		}
		o.r.header = name
		switch name {
		case "X-Forwarded-For":
			o.r.kind = kindXFF
		case "Forwarded":
			o.r.kind = kindForwarded
		default:
			o.r.kind = kindSingle
		}
	}
}

// GroupIPv6 keys IPv6 clients by their first bits bits (default 64; 128
// keys each address on its own).
func GroupIPv6(bits int) Option {
	return func(o *options) {
		if bits < 1 || bits > 128 {
			o.fail(fmt.Errorf("clientip: IPv6 group must be 1 to 128 bits, got %d", bits))
			return
		}
		o.r.v6Bits = bits
	}
}

// GroupIPv4 keys IPv4 clients by their first bits bits (default 32: each
// address on its own; 24 groups a /24).
func GroupIPv4(bits int) Option {
	return func(o *options) {
		if bits < 1 || bits > 32 {
			o.fail(fmt.Errorf("clientip: IPv4 group must be 1 to 32 bits, got %d", bits))
			return
		}
		o.r.v4Bits = bits
	}
}

// New returns a Resolver configured by opts, or the first configuration
// error.
func New(opts ...Option) (*Resolver, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.err != nil {
		return nil, o.err
	}
	return &o.r, nil
}

// MustNew is New that panics on a configuration error, for package-level
// variables and tests with constant options.
func MustNew(opts ...Option) *Resolver {
	r, err := New(opts...)
	if err != nil {
		panic(err)
	}
	return r
}

// Header returns the canonical name of the header read from trusted
// proxies.
func (r *Resolver) Header() string {
	if r.header == "" {
		return "X-Forwarded-For"
	}
	return r.header
}

// isTrusted reports whether a is a trusted proxy.
func (r *Resolver) isTrusted(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range r.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Addr returns the client address of req: its peer, or when the peer is a
// trusted proxy, the address found by walking the forwarding header. It
// returns the zero Addr when RemoteAddr is not an IP address (a Unix
// socket, for instance).
func (r *Resolver) Addr(req *http.Request) netip.Addr {
	if len(r.trusted) == 0 {
		return parsePeer(req.RemoteAddr) // no header to read
	}
	return r.Resolve(req.RemoteAddr, req.Header[r.Header()])
}

// Resolve returns the client address for a connection from remoteAddr
// ("host:port" or a bare host, as http.Request.RemoteAddr and a gRPC peer's
// address spell it) whose request carried fieldLines in the configured
// header (every line, in the order received). It is Addr without net/http:
// a gRPC server passes its peer's address and the values of its
// "x-forwarded-for" metadata. It returns the zero Addr when remoteAddr is
// not an IP address (a Unix socket, for instance).
func (r *Resolver) Resolve(remoteAddr string, fieldLines []string) netip.Addr {
	peer := parsePeer(remoteAddr)
	if !peer.IsValid() || !r.isTrusted(peer) || len(fieldLines) == 0 {
		return peer
	}
	if r.kind == kindSingle {
		// A proxy that sets such a header replaces it, so the last line
		// is the one it wrote.
		if a, ok := parseHost(strings.TrimSpace(fieldLines[len(fieldLines)-1])); ok {
			return a
		}
		return peer
	}
	var stack [16]string
	hops := stack[:0]
	for _, line := range fieldLines {
		if r.kind == kindForwarded {
			hops = appendForwardedFor(hops, line)
		} else {
			hops = appendXFF(hops, line)
		}
	}
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := parseHost(hops[i])
		if !ok {
			// A trusted proxy writes an address; anything else ("unknown",
			// an obfuscated name, garbage) leaves the nearest trusted hop
			// as the best the server can know.
			return client
		}
		client = a
		if !r.isTrusted(a) {
			return a
		}
	}
	return client // every hop trusted: the leftmost is the client
}

// prefix returns the group a belongs to: its /64 (GroupIPv6) for IPv6, the
// address itself (GroupIPv4) for IPv4.
func (r *Resolver) prefix(a netip.Addr) netip.Prefix {
	a = a.Unmap().WithZone("")
	bits := r.v4Bits
	if bits == 0 {
		bits = 32
	}
	if a.Is6() {
		bits = r.v6Bits
		if bits == 0 {
			bits = 64
		}
	}
	p, _ := a.Prefix(bits)
	return p
}

// AppendKey appends the text of a's group to dst: the address for a single
// address ("203.0.113.7", "2001:db8::1"), the prefix otherwise
// ("2001:db8:1:2::/64"). It appends nothing for the zero Addr.
func (r *Resolver) AppendKey(dst []byte, a netip.Addr) []byte {
	if !a.IsValid() {
		return dst
	}
	if a.Is4() && (r.v4Bits == 0 || r.v4Bits == 32) {
		return a.AppendTo(dst) // an IPv4 address keyed whole: itself
	}
	p := r.prefix(a)
	if p.Bits() == p.Addr().BitLen() {
		return p.Addr().AppendTo(dst)
	}
	return p.AppendTo(dst)
}

// Key returns the rate-limit key of req's client: AppendKey of Addr, or
// RemoteAddr itself when that is not an IP address.
func (r *Resolver) Key(req *http.Request) string {
	a := r.Addr(req)
	if !a.IsValid() {
		return req.RemoteAddr
	}
	var buf [64]byte
	return string(r.AppendKey(buf[:0], a))
}

// parsePeer parses a connection's remote address, "host:port" or a bare
// host, as http.Request.RemoteAddr and gRPC's peer hold it. It returns the
// zero Addr when it is not an IP address.
func parsePeer(remoteAddr string) netip.Addr {
	if a, ok := parseIPv4Host(remoteAddr); ok {
		return a // the usual peer: an IPv4 address and a port
	}
	if ap, err := netip.ParseAddrPort(remoteAddr); err == nil {
		return ap.Addr().Unmap().WithZone("")
	}
	a, _ := parseHost(remoteAddr)
	return a
}

// parseHost parses an address as proxies write it: "192.0.2.1",
// "192.0.2.1:8080", "2001:db8::1", "[2001:db8::1]" or "[2001:db8::1]:8080".
func parseHost(s string) (netip.Addr, bool) {
	if a, ok := parseIPv4Host(s); ok {
		return a, true
	}
	if s == "" {
		return netip.Addr{}, false
	}
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 || (end+1 < len(s) && s[end+1] != ':') {
			return netip.Addr{}, false
		}
		s = s[1:end]
	} else if i := strings.IndexByte(s, ':'); i >= 0 && strings.IndexByte(s[i+1:], ':') < 0 {
		s = s[:i] // IPv4 with a port: exactly one colon
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

// parseIPv4Host is the quick way of parsePeer and parseHost for what they
// mostly see: an IPv4 address in dotted decimal, alone or followed by ':'
// and a port (anything without another ':'). It accepts only what
// netip.ParseAddr accepts as IPv4 — four fields of 1 to 3 digits, none
// above 255 nor starting with a 0 unless it is 0 — and returns the same
// address; anything else is false, for the general way to decide.
func parseIPv4Host(s string) (netip.Addr, bool) {
	var (
		ip     [4]byte
		field  int
		digits int
		v      int
	)
	i := 0
	for ; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
			if digits == 1 && v == 0 {
				return netip.Addr{}, false // a leading zero
			}
			v = v*10 + int(c-'0')
			digits++
			if v > 255 {
				return netip.Addr{}, false
			}
			continue
		case c == '.' && field < 3 && digits > 0:
			ip[field] = byte(v)
			field, digits, v = field+1, 0, 0
			continue
		case c == ':':
		default:
			return netip.Addr{}, false
		}
		break // the port
	}
	if field != 3 || digits == 0 || strings.IndexByte(s[min(i+1, len(s)):], ':') >= 0 {
		return netip.Addr{}, false
	}
	ip[3] = byte(v)
	return netip.AddrFrom4(ip), true
}

// appendXFF appends the comma-separated entries of one X-Forwarded-For line,
// skipping empty ones as HTTP list syntax requires.
func appendXFF(hops []string, line string) []string {
	for line != "" {
		var entry string
		entry, line, _ = strings.Cut(line, ",")
		if entry = strings.TrimSpace(entry); entry != "" {
			hops = append(hops, entry)
		}
	}
	return hops
}

// appendForwardedFor appends the for= value of each element of one
// Forwarded line (RFC 7239 §4), "" for an element without one.
//
//	Forwarded: for=192.0.2.60;proto=http;by=203.0.113.43, for="[2001:db8:cafe::17]:4711"
func appendForwardedFor(hops []string, line string) []string {
	for line != "" {
		var elem string
		elem, line = cutUnquoted(line, ',')
		if strings.TrimSpace(elem) == "" {
			continue
		}
		hop := ""
		for elem != "" {
			var pair string
			pair, elem = cutUnquoted(elem, ';')
			name, value, ok := strings.Cut(pair, "=")
			if ok && strings.EqualFold(strings.TrimSpace(name), "for") {
				hop = unquote(strings.TrimSpace(value))
			}
		}
		hops = append(hops, hop)
	}
	return hops
}

// cutUnquoted cuts s around the first sep outside a quoted-string.
func cutUnquoted(s string, sep byte) (before, after string) {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++ // the escaped character
		case c == '"':
			quoted = !quoted
		case !quoted && c == sep:
			return s[:i], s[i+1:]
		}
	}
	return s, ""
}

// unquote strips the quotes of a quoted-string. A value with escapes is not
// an address, so it comes back empty rather than unescaped.
func unquote(v string) string {
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = v[1 : len(v)-1]
		if strings.IndexByte(v, '\\') >= 0 {
			return ""
		}
	}
	return v
}

// unmapPrefix turns a range of IPv4-mapped IPv6 addresses into the IPv4
// range it maps, so that it matches unmapped peers.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	a := p.Addr()
	if a.Is4In6() && p.Bits() >= 96 {
		q, _ := a.Unmap().Prefix(p.Bits() - 96)
		return q
	}
	q, _ := a.WithZone("").Prefix(p.Bits())
	return q
}
