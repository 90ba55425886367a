package clientip_test

import (
	"net/http"
	"net/netip"
	"testing"

	"github.com/tollgate/tollgate/clientip"
)

func request(remote string, h http.Header) *http.Request {
	r := &http.Request{RemoteAddr: remote, Header: http.Header{}}
	for k, vs := range h {
		for _, v := range vs {
			r.Header.Add(k, v)
		}
	}
	return r
}

func TestKey(t *testing.T) {
	t.Parallel()
	proxies := clientip.TrustProxies("10.0.0.0/8", "2001:db8:ffff::/48", "192.0.2.10")
	xff := clientip.MustNew(proxies)
	fwd := clientip.MustNew(proxies, clientip.FromHeader("forwarded"))
	real := clientip.MustNew(proxies, clientip.FromHeader("X-Real-IP"))
	none := &clientip.Resolver{}

	for _, tc := range []struct {
		name   string
		r      *clientip.Resolver
		remote string
		h      http.Header
		want   string
	}{
		// Untrusted peers: headers are ignored whatever they say.
		{"no proxy, no header", none, "203.0.113.7:5000", nil, "203.0.113.7"},
		{"spoofed XFF from the internet", xff, "198.51.100.9:5000", http.Header{"X-Forwarded-For": {"1.2.3.4"}}, "198.51.100.9"},
		{"spoofed Forwarded from the internet", fwd, "198.51.100.9:5000", http.Header{"Forwarded": {"for=1.2.3.4"}}, "198.51.100.9"},
		{"spoofed X-Real-IP from the internet", real, "198.51.100.9:5000", http.Header{"X-Real-Ip": {"1.2.3.4"}}, "198.51.100.9"},
		{"zero resolver trusts nobody", none, "10.0.0.9:5000", http.Header{"X-Forwarded-For": {"1.2.3.4"}}, "10.0.0.9"},

		// Trusted peers: walk from the right to the first untrusted hop.
		{"one proxy", xff, "10.0.0.9:5000", http.Header{"X-Forwarded-For": {"203.0.113.7"}}, "203.0.113.7"},
		{"client spoofs the left", xff, "10.0.0.9:5000", http.Header{"X-Forwarded-For": {"1.2.3.4, 203.0.113.7"}}, "203.0.113.7"},
		{"chain of proxies", xff, "10.0.0.9:5000", http.Header{"X-Forwarded-For": {"1.2.3.4, 203.0.113.7, 10.0.0.5, 192.0.2.10"}}, "203.0.113.7"},
		{"spoof across lines", xff, "10.0.0.9:5000", http.Header{"X-Forwarded-For": {"1.2.3.4", "203.0.113.7"}}, "203.0.113.7"},
		{"every hop trusted", xff, "10.0.0.9:5000", http.Header{"X-Forwarded-For": {"10.0.0.1, 10.0.0.2"}}, "10.0.0.1"},
		{"no header from a proxy", xff, "10.0.0.9:5000", nil, "10.0.0.9"},
		{"garbage nearest: stop at the proxy", xff, "10.0.0.9:5000", http.Header{"X-Forwarded-For": {"203.0.113.7, not-an-ip"}}, "10.0.0.9"},
		{"garbage beyond the client", xff, "10.0.0.9:5000", http.Header{"X-Forwarded-For": {"evil, 203.0.113.7"}}, "203.0.113.7"},
		{"empty elements", xff, "10.0.0.9:5000", http.Header{"X-Forwarded-For": {"203.0.113.7, , "}}, "203.0.113.7"},
		{"entry with a port", xff, "10.0.0.9:5000", http.Header{"X-Forwarded-For": {"203.0.113.7:4711"}}, "203.0.113.7"},
		{"IPv6 entry, bracketed with port", xff, "10.0.0.9:5000", http.Header{"X-Forwarded-For": {"[2001:db8:1:2::99]:443"}}, "2001:db8:1:2::/64"},
		{"only the configured header", xff, "10.0.0.9:5000", http.Header{"X-Forwarded-For": {"203.0.113.7"}, "Forwarded": {"for=1.2.3.4"}, "X-Real-Ip": {"1.2.3.4"}}, "203.0.113.7"},
		{"IPv6 proxy", xff, "[2001:db8:ffff::1]:5000", http.Header{"X-Forwarded-For": {"203.0.113.7"}}, "203.0.113.7"},
		{"IPv4-mapped peer", xff, "[::ffff:10.0.0.9]:5000", http.Header{"X-Forwarded-For": {"203.0.113.7"}}, "203.0.113.7"},
		{"IPv4-mapped entry", xff, "10.0.0.9:5000", http.Header{"X-Forwarded-For": {"::ffff:203.0.113.7"}}, "203.0.113.7"},

		{"Forwarded", fwd, "10.0.0.9:5000", http.Header{"Forwarded": {"for=1.2.3.4, for=203.0.113.7;proto=https;by=10.0.0.9"}}, "203.0.113.7"},
		{"Forwarded IPv6 quoted", fwd, "10.0.0.9:5000", http.Header{"Forwarded": {`for="[2001:db8:cafe::17]:4711"`}}, "2001:db8:cafe::/64"},
		{"Forwarded case and spaces", fwd, "10.0.0.9:5000", http.Header{"Forwarded": {`For=1.2.3.4 ,  proto=http; FOR = 203.0.113.7`}}, "203.0.113.7"},
		{"Forwarded quoted comma", fwd, "10.0.0.9:5000", http.Header{"Forwarded": {`for=203.0.113.7;ext="a, for=1.2.3.4"`}}, "203.0.113.7"},
		{"Forwarded unknown nearest", fwd, "10.0.0.9:5000", http.Header{"Forwarded": {"for=1.2.3.4, for=unknown"}}, "10.0.0.9"},
		{"Forwarded obfuscated nearest", fwd, "10.0.0.9:5000", http.Header{"Forwarded": {"for=_hidden"}}, "10.0.0.9"},
		{"Forwarded element without for", fwd, "10.0.0.9:5000", http.Header{"Forwarded": {"for=1.2.3.4, proto=https"}}, "10.0.0.9"},
		{"Forwarded through trusted hops", fwd, "10.0.0.9:5000", http.Header{"Forwarded": {"for=203.0.113.7", "for=10.0.0.3"}}, "203.0.113.7"},

		{"X-Real-IP", real, "10.0.0.9:5000", http.Header{"X-Real-Ip": {"203.0.113.7"}}, "203.0.113.7"},
		{"X-Real-IP, last line wins", real, "10.0.0.9:5000", http.Header{"X-Real-Ip": {"1.2.3.4", "203.0.113.7"}}, "203.0.113.7"},
		{"X-Real-IP garbage", real, "10.0.0.9:5000", http.Header{"X-Real-Ip": {"nope"}}, "10.0.0.9"},

		{"Unix socket peer", xff, "@", http.Header{"X-Forwarded-For": {"1.2.3.4"}}, "@"},
		{"IPv6 peer grouped", none, "[2001:db8:1:2:3:4:5:6]:5000", nil, "2001:db8:1:2::/64"},
		{"IPv6 peer with zone", none, "[fe80::1%eth0]:5000", nil, "fe80::/64"},
	} {
		if got := tc.r.Key(request(tc.remote, tc.h)); got != tc.want {
			t.Errorf("%s: Key = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestGrouping(t *testing.T) {
	t.Parallel()
	def := &clientip.Resolver{}
	g48 := clientip.MustNew(clientip.GroupIPv6(48), clientip.GroupIPv4(24))
	g128 := clientip.MustNew(clientip.GroupIPv6(128))
	for _, tc := range []struct {
		r    *clientip.Resolver
		a, b string
		same bool
	}{
		{def, "2001:db8:1:2::1", "2001:db8:1:2:ffff:ffff:ffff:ffff", true},
		{def, "2001:db8:1:2::1", "2001:db8:1:3::1", false},
		{def, "192.0.2.1", "192.0.2.2", false},
		{g48, "2001:db8:1:2::1", "2001:db8:1:ffff::1", true},
		{g48, "2001:db8:1::1", "2001:db8:2::1", false},
		{g48, "192.0.2.1", "192.0.2.200", true},
		{g128, "2001:db8:1:2::1", "2001:db8:1:2::2", false},
	} {
		ka := tc.r.Key(request("["+tc.a+"]:1", nil))
		if netip.MustParseAddr(tc.a).Is4() {
			ka = tc.r.Key(request(tc.a+":1", nil))
		}
		kb := tc.r.Key(request("["+tc.b+"]:1", nil))
		if netip.MustParseAddr(tc.b).Is4() {
			kb = tc.r.Key(request(tc.b+":1", nil))
		}
		if (ka == kb) != tc.same {
			t.Errorf("%s → %q and %s → %q: same = %v, want %v", tc.a, ka, tc.b, kb, ka == kb, tc.same)
		}
	}
	if got, want := g128.Key(request("[2001:db8::1]:1", nil)), "2001:db8::1"; got != want {
		t.Errorf("/128 key = %q, want the address %q", got, want)
	}
}

func TestResolveWithoutHTTP(t *testing.T) {
	t.Parallel()
	r := clientip.MustNew(clientip.TrustProxies("127.0.0.1"))
	got := r.Resolve("127.0.0.1", []string{"1.2.3.4, 203.0.113.7"})
	if want := netip.MustParseAddr("203.0.113.7"); got != want {
		t.Errorf("Resolve = %v, want %v", got, want)
	}
	if got := r.Resolve("127.0.0.2", []string{"203.0.113.7"}); got != netip.MustParseAddr("127.0.0.2") {
		t.Errorf("Resolve from an untrusted peer = %v", got)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opt  clientip.Option
	}{
		{"bad CIDR", clientip.TrustProxies("10.0.0.0/33")},
		{"not an address", clientip.TrustProxies("proxy.internal")},
		{"IPv6 group 0", clientip.GroupIPv6(0)},
		{"IPv4 group 33", clientip.GroupIPv4(33)},
		{"empty header", clientip.FromHeader(" ")},
	} {
		if r, err := clientip.New(tc.opt); err == nil {
			t.Errorf("%s: New = %v, nil; want an error", tc.name, r)
		}
	}
}

func TestKeyAllocs(t *testing.T) {
	r := clientip.MustNew(clientip.TrustProxies("10.0.0.0/8"))
	req := request("10.0.0.9:5000", http.Header{"X-Forwarded-For": {"1.2.3.4, 2001:db8:1:2::3, 10.0.0.5"}})
	var buf [64]byte
	allocs := testing.AllocsPerRun(100, func() {
		_ = r.AppendKey(buf[:0], r.Addr(req))
	})
	if allocs != 0 {
		t.Errorf("AppendKey(Addr) allocates %v times, want 0", allocs)
	}
}
