package httplimit

import (
	"fmt"
	"net"
	"net/http"
	"strings"
)

// pattern is a request pattern in net/http.ServeMux's syntax (Go 1.22+):
// "[METHOD ][HOST]/[PATH]", where a path segment may be a wildcard {name},
// a final {name...} or a trailing slash matches the rest of the path, and a
// final {$} matches only the path ending in a slash. A GET pattern also
// matches HEAD. Unlike ServeMux there is no precedence: a rule applies to
// every request its pattern matches, whatever other rules match.
type pattern struct {
	method string
	host   string
	segs   []string // literal segments; "" for a {name} wildcard
	prefix bool     // matches anything below the segments
	exact  bool     // {$}: matches only the segments followed by "/"
}

func parsePattern(s string) (*pattern, error) {
	p := &pattern{}
	rest := strings.TrimSpace(s)
	if m, r, ok := strings.Cut(rest, " "); ok {
		p.method, rest = m, strings.TrimLeft(r, " \t")
		for _, c := range p.method {
			if c < 'A' || c > 'Z' {
				return nil, fmt.Errorf("httplimit: pattern %q: bad method %q", s, p.method)
			}
		}
	}
	i := strings.IndexByte(rest, '/')
	if i < 0 {
		return nil, fmt.Errorf("httplimit: pattern %q: the path must start with /", s)
	}
	p.host, rest = rest[:i], rest[i+1:]
	if rest == "" {
		p.prefix = true // "/" matches every path
		return p, nil
	}
	parts := strings.Split(rest, "/")
	for j, part := range parts {
		last := j == len(parts)-1
		switch {
		case last && part == "":
			p.prefix = true // trailing slash
		case part == "":
			return nil, fmt.Errorf("httplimit: pattern %q: empty path segment", s)
		case part == "{$}":
			if !last {
				return nil, fmt.Errorf("httplimit: pattern %q: {$} must end the pattern", s)
			}
			p.exact = true
		case strings.HasPrefix(part, "{") && strings.HasSuffix(part, "...}"):
			if !last {
				return nil, fmt.Errorf("httplimit: pattern %q: {name...} must end the pattern", s)
			}
			p.prefix = true
		case strings.HasPrefix(part, "{") && strings.HasSuffix(part, "}"):
			p.segs = append(p.segs, "")
		case strings.ContainsAny(part, "{}"):
			return nil, fmt.Errorf("httplimit: pattern %q: a wildcard must be a whole segment", s)
		default:
			p.segs = append(p.segs, part)
		}
	}
	return p, nil
}

func (p *pattern) match(r *http.Request) bool {
	if p.method != "" && p.method != r.Method && (p.method != http.MethodGet || r.Method != http.MethodHead) {
		return false
	}
	if p.host != "" {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if !strings.EqualFold(host, p.host) {
			return false
		}
	}
	rest := r.URL.Path
	for _, seg := range p.segs {
		if rest == "" || rest[0] != '/' {
			return false
		}
		rest = rest[1:]
		end := strings.IndexByte(rest, '/')
		if end < 0 {
			end = len(rest)
		}
		if part := rest[:end]; part == "" || (seg != "" && part != seg) {
			return false
		}
		rest = rest[end:]
	}
	switch {
	case p.exact:
		return rest == "/"
	case p.prefix:
		return strings.HasPrefix(rest, "/")
	default:
		return rest == ""
	}
}
