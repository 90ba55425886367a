package clientip

import (
	"net/netip"
	"strings"
	"testing"
)

// parsePeerSlow and parseHostSlow are parsePeer and parseHost without
// their quick way for IPv4 (parseIPv4Host): the answers it must give.
func parsePeerSlow(remoteAddr string) netip.Addr {
	if ap, err := netip.ParseAddrPort(remoteAddr); err == nil {
		return ap.Addr().Unmap().WithZone("")
	}
	a, _ := parseHostSlow(remoteAddr)
	return a
}

func parseHostSlow(s string) (netip.Addr, bool) {
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
		s = s[:i]
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

var parseSeeds = []string{
	"192.0.2.1:40000", "192.0.2.1", "192.0.2.1:", "192.0.2.1:x", "192.0.2.1:1:2", "0.0.0.0:0",
	"255.255.255.255:65535", "256.0.0.1:1", "01.2.3.4:5", "1.2.3.04", "1.2.3", "1.2.3.4.5", "1..2.3",
	".1.2.3", "1.2.3.", "1.2.3.4 ", " 1.2.3.4", "1.2.3.4:99999", "1000.2.3.4", "[::ffff:1.2.3.4]:80",
	"::ffff:1.2.3.4", "[2001:db8::1]:443", "2001:db8::1", "fe80::1%eth0", "", ":", ":80", "a.b.c.d",
	"1.2.3.4%eth0", "1.2.3.-4", "1.2.3.4:+80", "@", "10.0.0.9:5000",
}

// TestParseIPv4Host checks the quick way against the general one on
// addresses and near misses.
func TestParseIPv4Host(t *testing.T) {
	t.Parallel()
	for _, s := range parseSeeds {
		if got, want := parsePeer(s), parsePeerSlow(s); got != want {
			t.Errorf("parsePeer(%q) = %v, want %v", s, got, want)
		}
		got, ok := parseHost(s)
		want, wok := parseHostSlow(s)
		if got != want || ok != wok {
			t.Errorf("parseHost(%q) = %v, %v; want %v, %v", s, got, ok, want, wok)
		}
	}
}

// FuzzParseIPv4Host checks the quick way against the general one on any
// input.
func FuzzParseIPv4Host(f *testing.F) {
	for _, s := range parseSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := parsePeer(s), parsePeerSlow(s); got != want {
			t.Errorf("parsePeer(%q) = %v, want %v", s, got, want)
		}
		got, ok := parseHost(s)
		want, wok := parseHostSlow(s)
		if got != want || ok != wok {
			t.Errorf("parseHost(%q) = %v, %v; want %v, %v", s, got, ok, want, wok)
		}
	})
}
