package service

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// specCache keeps the parsed descriptor specs of the auth endpoint's query
// strings: a proxy's configuration sends the same few again and again.
// The query comes from whoever reaches the endpoint, so the cache is
// bounded in bytes, not only in entries: it keeps specs of at most
// maxCachedSpec bytes (a proxy's are a few dozen), at most maxCachedSpecs
// of them, and starts afresh when full. Longer specs are parsed on every
// request, as often as they come and no more.
type specCache struct {
	mu sync.Mutex
	m  map[string][]descriptorSpec
}

const (
	maxCachedSpec  = 512
	maxCachedSpecs = 256
)

// get parses raw (the descriptor query parameters), refusing more than
// maxDescs specs or a spec of more than maxEntries entries.
func (c *specCache) get(raw []string, maxDescs, maxEntries int) ([]descriptorSpec, error) {
	if len(raw) > maxDescs {
		return nil, fmt.Errorf("server: %d descriptors: at most %d are allowed", len(raw), maxDescs)
	}
	size := len(raw)
	for _, d := range raw {
		size += len(d)
	}
	cacheable := size <= maxCachedSpec
	var k string
	if cacheable {
		k = strings.Join(raw, "\x00")
		c.mu.Lock()
		specs, ok := c.m[k]
		c.mu.Unlock()
		if ok {
			return specs, nil
		}
	}
	specs := make([]descriptorSpec, 0, len(raw))
	for _, d := range raw {
		if n := strings.Count(d, ",") + 1; n > maxEntries {
			return nil, fmt.Errorf("server: descriptor of %d entries: at most %d are allowed", n, maxEntries)
		}
		spec, err := parseSpec(d)
		if err != nil {
			return nil, err
		}
		specs = append(specs, spec)
	}
	if cacheable {
		c.mu.Lock()
		if c.m == nil || len(c.m) >= maxCachedSpecs {
			c.m = map[string][]descriptorSpec{} // bounded: start afresh
		}
		c.m[k] = specs
		c.mu.Unlock()
	}
	return specs, nil
}

// AuthHandler returns the endpoint for nginx's auth_request (and
// forward-auth in Traefik, Caddy and the like): for each request it builds
// descriptors from what the proxy passes, decides, and answers 200 when
// allowed or 429 when over the limit, with the rate-limit header fields
// (and Retry-After) for the proxy to copy into its response.
//
// The proxy passes the original request in the two headers rules names
// (by default X-Original-URI and X-Original-Method; see HTTPRules), and
// the client's address in the header rules.ClientIP reads, from an address
// it trusts. A request without exactly one of each header is answered 400:
// the endpoint is misconfigured or reached from elsewhere than the proxy.
// The path is the original target normalized by NormalizePath, and a
// target it refuses is answered 400 too. Query parameters override rules per location: domain=NAME,
// descriptor=SPEC (repeatable), and deny_status=403 — nginx's auth_request
// accepts only 2xx, 401 and 403 from the endpoint, so an nginx location asks
// for 403 and turns it into a 429 itself (see examples/nginx).
func (s *Server) AuthHandler(rules HTTPRules) (http.Handler, error) {
	hr, err := rules.compile()
	if err != nil {
		return nil, err
	}
	var cache specCache
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var err error // the handler's own: requests run concurrently
		q := r.URL.Query()
		domain := hr.domain
		if d := q.Get("domain"); d != "" {
			domain = d
		}
		specs := hr.specs
		if raw := q["descriptor"]; len(raw) > 0 {
			if specs, err = cache.get(raw, s.max.descriptors, s.max.entries); err != nil {
				s.authInvalid(w, err.Error())
				return
			}
		}
		deny := http.StatusTooManyRequests
		if ds := q.Get("deny_status"); ds != "" {
			if deny, err = strconv.Atoi(ds); err != nil || deny < 400 || deny > 599 {
				s.authInvalid(w, "deny_status must be a 4xx or 5xx status")
				return
			}
		}
		if domain == "" {
			s.authInvalid(w, "no domain: pass ?domain=NAME")
			return
		}
		uri, method, msg := hr.original(r)
		if msg != "" {
			s.authInvalid(w, msg)
			return
		}
		path, perr := NormalizePath(uri)
		if perr != nil {
			s.authInvalid(w, fmt.Sprintf("%s %q: %v", hr.uriHeader, uri, perr))
			return
		}
		req, missing := hr.request(domain, specs, r, path, method)
		s.leftOut(apiNginx, domain, missing)
		if len(req.Descriptors) == 0 {
			// Nothing to limit on (a header the descriptors need is
			// missing): allowed, as Envoy does.
			s.m.requests[apiNginx][codeOK].Inc()
			w.WriteHeader(http.StatusOK)
			return
		}
		resp, h, err := s.decide(r.Context(), apiNginx, req, false)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for k, v := range h {
			w.Header()[k] = v
		}
		if resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT {
			http.Error(w, "rate limit exceeded", deny)
			return
		}
		w.WriteHeader(http.StatusOK)
	}), nil
}

// The headers Caddy's forward_auth and Traefik's ForwardAuth set on every
// request they ask about, replacing the client's.
const (
	forwardAuthURIHeader    = "X-Forwarded-Uri"
	forwardAuthMethodHeader = "X-Forwarded-Method"
)

// original returns the original request's target and method from the
// configured headers, or why they cannot be read.
//
// A request that carries both of forward auth's headers while others are
// configured came through Caddy or Traefik, which pass the client's own
// headers through: the configured ones may be the client's, choosing the
// path it is counted by, so it is refused.
func (h *httpRules) original(r *http.Request) (uri, method, msg string) {
	if h.uriHeader != forwardAuthURIHeader && len(r.Header[forwardAuthURIHeader]) > 0 && len(r.Header[forwardAuthMethodHeader]) > 0 {
		return "", "", h.withHelp(fmt.Sprintf("want %s and %s, but the request carries %s and %s, as Caddy's and Traefik's forward auth send: %s may be the client's own, refused",
			h.uriHeader, h.methHeader, forwardAuthURIHeader, forwardAuthMethodHeader, h.uriHeader))
	}
	u, m := r.Header[h.uriHeader], r.Header[h.methHeader]
	if len(u) != 1 || u[0] == "" || len(m) != 1 || m[0] == "" {
		return "", "", h.withHelp(fmt.Sprintf("want exactly one %s and one %s header, set by the proxy: got %d and %d", h.uriHeader, h.methHeader, len(u), len(m)))
	}
	return u[0], m[0], ""
}

// withHelp ends msg, about the headers, with HTTPRules.HeaderHelp.
func (h *httpRules) withHelp(msg string) string {
	if h.help == "" {
		return msg
	}
	return msg + " (" + h.help + ")"
}

// authInvalid answers an invalid request to the auth endpoint.
func (s *Server) authInvalid(w http.ResponseWriter, msg string) {
	s.countInvalid(apiNginx, invalidAuth)
	http.Error(w, msg, http.StatusBadRequest)
}
