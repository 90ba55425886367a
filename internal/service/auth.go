package service

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate/tollgate/clientip"
	"github.com/tollgate/tollgate/headers"
)

// descriptorSpec is a parsed descriptor spec (see ParseDescriptorSpec).
type descriptorSpec []entrySpec

type entrySpec struct {
	key    string
	source int
	header string // for sourceHeader, canonical
}

const (
	sourceRemoteAddress = iota
	sourcePath
	sourceMethod
	sourceHeader
)

// ParseDescriptorSpec checks a descriptor spec, which says how to build one
// descriptor from an HTTP request:
// a comma-separated list of entries, each "source" or "key=source", where
// source is one of
//
//	remote_address    the client's address (through trusted proxies only)
//	path              the request's path, without the query
//	method            the request's method
//	header:NAME       the value of request header NAME
//
// and key defaults to the source's name ("header_" and the lower-cased
// header name for a header). "remote_address" is the descriptor
// [(remote_address, 203.0.113.7)]; "method,path" is [(method, GET), (path,
// /api/x)]; "api_key=header:X-API-Key" is [(api_key, <the key>)]. A
// descriptor whose header is absent from a request is left out of it, as
// Envoy leaves out a descriptor whose header is missing.
func ParseDescriptorSpec(spec string) error {
	_, err := parseSpec(spec)
	return err
}

func parseSpec(spec string) (descriptorSpec, error) {
	var d descriptorSpec
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		key, src, named := strings.Cut(part, "=")
		if !named {
			src = key
		}
		var e entrySpec
		switch {
		case src == "remote_address":
			e.source = sourceRemoteAddress
		case src == "path":
			e.source = sourcePath
		case src == "method":
			e.source = sourceMethod
		case strings.HasPrefix(src, "header:") && len(src) > len("header:"):
			e.source = sourceHeader
			e.header = http.CanonicalHeaderKey(src[len("header:"):])
			if !named {
				key = "header_" + strings.ToLower(src[len("header:"):])
			}
		default:
			return nil, fmt.Errorf("server: descriptor %q: unknown source %q (want remote_address, path, method or header:NAME)", spec, src)
		}
		if key == "" {
			return nil, fmt.Errorf("server: descriptor %q: an entry has an empty key", spec)
		}
		e.key = key
		d = append(d, e)
	}
	return d, nil
}

// HTTPRules say how HTTP requests become rate-limit requests, for the auth
// endpoint (Server.AuthHandler) and the reverse proxy (Server.Proxy).
type HTTPRules struct {
	// Domain is the domain of the requests (the auth endpoint's "domain"
	// query parameter overrides it).
	Domain string
	// Descriptors are descriptor specs (see ParseDescriptorSpec); the auth
	// endpoint's "descriptor" query parameters override them. Default:
	// "remote_address".
	Descriptors []string
	// ClientIP finds the client's address; nil takes the peer's address and
	// trusts no forwarding header.
	ClientIP *clientip.Resolver
	// URIHeader and MethodHeader name the headers in which the proxy in
	// front of the auth endpoint passes the original request's target and
	// method: by default nginx's X-Original-URI and X-Original-Method (as
	// examples/nginx sets them); X-Forwarded-Uri and X-Forwarded-Method
	// behind Traefik or Caddy forward-auth. Only these are read, never a
	// fallback: a proxy passes the client's own headers through, and a
	// client must not pick the path it is counted by. The proxy must set
	// them on every request, replacing any the client sent.
	URIHeader, MethodHeader string
}

// DefaultURIHeader and DefaultMethodHeader are the headers the auth
// endpoint reads the original request from unless HTTPRules says
// otherwise: nginx's, as examples/nginx sets them.
const (
	DefaultURIHeader    = "X-Original-URI"
	DefaultMethodHeader = "X-Original-Method"
)

type httpRules struct {
	domain     string
	specs      []descriptorSpec
	ip         *clientip.Resolver
	uriHeader  string
	methHeader string
}

func (h HTTPRules) compile() (*httpRules, error) {
	r := &httpRules{domain: h.Domain, ip: h.ClientIP, uriHeader: h.URIHeader, methHeader: h.MethodHeader}
	if r.ip == nil {
		r.ip = &clientip.Resolver{}
	}
	if r.uriHeader == "" {
		r.uriHeader = DefaultURIHeader
	}
	if r.methHeader == "" {
		r.methHeader = DefaultMethodHeader
	}
	r.uriHeader, r.methHeader = http.CanonicalHeaderKey(r.uriHeader), http.CanonicalHeaderKey(r.methHeader)
	descs := h.Descriptors
	if len(descs) == 0 {
		descs = []string{"remote_address"}
	}
	for _, d := range descs {
		spec, err := parseSpec(d)
		if err != nil {
			return nil, err
		}
		r.specs = append(r.specs, spec)
	}
	return r, nil
}

// request builds the rate-limit request for r. path and method are the
// original request's (for the auth endpoint, from headers the proxy set).
func (h *httpRules) request(domain string, specs []descriptorSpec, r *http.Request, path, method string) *pb.RateLimitRequest {
	req := &pb.RateLimitRequest{Domain: domain, Descriptors: make([]*rlv3.RateLimitDescriptor, 0, len(specs))}
	var client string
next:
	for _, spec := range specs {
		d := &rlv3.RateLimitDescriptor{Entries: make([]*rlv3.RateLimitDescriptor_Entry, len(spec))}
		for i, e := range spec {
			var v string
			switch e.source {
			case sourceRemoteAddress:
				if client == "" {
					client = h.ip.Key(r)
				}
				v = client
			case sourcePath:
				v = path
			case sourceMethod:
				v = method
			case sourceHeader:
				v = r.Header.Get(e.header)
			}
			if v == "" {
				continue next
			}
			d.Entries[i] = &rlv3.RateLimitDescriptor_Entry{Key: e.key, Value: v}
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req
}

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
		req := hr.request(domain, specs, r, path, method)
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

// original returns the original request's target and method from the
// configured headers, or why they cannot be read.
func (h *httpRules) original(r *http.Request) (uri, method, msg string) {
	u, m := r.Header[h.uriHeader], r.Header[h.methHeader]
	if len(u) != 1 || u[0] == "" || len(m) != 1 || m[0] == "" {
		return "", "", fmt.Sprintf("want exactly one %s and one %s header, set by the proxy: got %d and %d", h.uriHeader, h.methHeader, len(u), len(m))
	}
	return u[0], m[0], ""
}

// authInvalid answers an invalid request to the auth endpoint.
func (s *Server) authInvalid(w http.ResponseWriter, msg string) {
	s.countInvalid(apiNginx, invalidAuth)
	http.Error(w, msg, http.StatusBadRequest)
}

// Proxy returns a reverse proxy to upstream that applies the rules to
// every request first: over the limit, it answers 429 itself, with
// Retry-After, the rate-limit header fields and an RFC 9457 problem body;
// otherwise it forwards the request and adds the header fields to the
// upstream's response. Paths and methods are the request's own, the path
// normalized by NormalizePath (a path it refuses is answered 400).
func (s *Server) Proxy(upstream *url.URL, rules HTTPRules) (http.Handler, error) {
	hr, err := rules.compile()
	if err != nil {
		return nil, err
	}
	if hr.domain == "" {
		return nil, fmt.Errorf("server: proxy: no domain")
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.SetXForwarded()
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			s.log.Warn("proxy: upstream failed", "upstream", upstream.Redacted(), "error", err.Error())
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path, err := NormalizePath(r.URL.EscapedPath())
		if err != nil {
			s.countInvalid(apiProxy, invalidRequest)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		req := hr.request(hr.domain, hr.specs, r, path, r.Method)
		if len(req.Descriptors) > 0 {
			resp, h, err := s.decide(r.Context(), apiProxy, req, false)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			for k, v := range h {
				w.Header()[k] = v
			}
			if resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT {
				writeProblem(w, r, h)
				return
			}
		} else {
			s.m.requests[apiProxy][codeOK].Inc()
		}
		rp.ServeHTTP(w, r)
	}), nil
}

// writeProblem answers 429 with an RFC 9457 problem body.
func writeProblem(w http.ResponseWriter, r *http.Request, h http.Header) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	if _, ok := h[headers.RetryAfterField]; !ok {
		w.Header().Set(headers.RetryAfterField, "1")
	}
	w.WriteHeader(http.StatusTooManyRequests)
	retry := w.Header().Get(headers.RetryAfterField)
	instance, _ := json.Marshal(r.URL.Path)
	io.WriteString(w, `{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"rate limit exceeded; retry after `+retry+` s","instance":`+string(instance)+`}`)
}
