package service

import (
	"fmt"
	"net/http"
	"strings"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate/tollgate/clientip"
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
	// them on every request, replacing any the client sent. With other
	// headers configured, a request carrying both X-Forwarded-Uri and
	// X-Forwarded-Method came through forward auth, and is refused: there
	// the configured ones would be the client's.
	URIHeader, MethodHeader string
	// HeaderHelp ends the 400 answering a request without those headers:
	// how to name the right ones (tollgate serve names its flags).
	HeaderHelp string
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
	help       string
}

func (h HTTPRules) compile() (*httpRules, error) {
	r := &httpRules{domain: h.Domain, ip: h.ClientIP, uriHeader: h.URIHeader, methHeader: h.MethodHeader, help: h.HeaderHelp}
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
func (h *httpRules) request(domain string, specs []descriptorSpec, r *http.Request, path, method string) (req *pb.RateLimitRequest, missing []missingValue) {
	req = &pb.RateLimitRequest{Domain: domain, Descriptors: make([]*rlv3.RateLimitDescriptor, 0, len(specs))}
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
				missing = append(missing, missingValue{spec, i})
				continue next
			}
			d.Entries[i] = &rlv3.RateLimitDescriptor_Entry{Key: e.key, Value: v}
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req, missing
}

// missingValue is a descriptor left out of a request because the value of
// its entry i was empty: a header the request does not carry, most often.
type missingValue struct {
	spec descriptorSpec
	i    int
}

// sourceName is where entry i's value comes from, as a descriptor spec
// names it: remote_address, path, method or header:NAME.
func (d descriptorSpec) sourceName(i int) string {
	switch e := d[i]; e.source {
	case sourceRemoteAddress:
		return "remote_address"
	case sourcePath:
		return "path"
	case sourceMethod:
		return "method"
	default:
		return "header:" + e.header
	}
}
