package service

import (
	"net/http"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/headers"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/service/config"
)

// headerOrder is the order of the fields headers.Write may set in
// response_headers_to_add, spelled as they are sent there (Envoy sends them
// as given); an http.Header keys each by http.CanonicalHeaderKey of it.
var headerOrder = [...]string{"RateLimit-Policy", "RateLimit", "RateLimit-Limit", "RateLimit-Remaining",
	"RateLimit-Reset", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After"}

// headerStyle is how the server writes the rate-limit header fields of
// its answers.
type headerStyle struct {
	flavor headers.Flavor              // which fields (WithHeaders)
	names  map[string]string           // header field (canonical key) → name it is sent as (WithHeaderNames)
	wire   [len(headerOrder)]wireField // response_headers_to_add: fields and names, in order
}

// wireField is one field of response_headers_to_add: its key in the
// server's header map and the name it is sent as.
type wireField struct{ key, wire string }

// wireFields is headerOrder as the server sends it, its renamed fields
// (WithHeaderNames) included: worked out once, in New.
func (s *Server) wireFields() [len(headerOrder)]wireField {
	var fs [len(headerOrder)]wireField
	for i, name := range headerOrder {
		fs[i].key, fs[i].wire = s.headerName(name)
	}
	return fs
}

// headerName returns the key in the server's header map of the field sent
// as wire, and the name it is sent as in response_headers_to_add.
func (s *Server) headerName(wire string) (key, name string) {
	field := http.CanonicalHeaderKey(wire)
	if name, ok := s.hdr.names[field]; ok {
		return http.CanonicalHeaderKey(name), name
	}
	return field, wire
}

// headerDecision is the header fields' view of outcome o of rule r: a
// policy named after the rule.
func headerDecision(r *config.Rule, o engine.Outcome, res tollgate.Result) headers.Decision {
	res.Allowed = o == engine.Allowed
	policy := r.Name
	if policy == "" {
		policy = r.ID
	}
	return headers.Decision{Policy: policy, Result: res, DryRun: r.DryRun}
}

// httpHeader returns the header fields of hds, in the server's flavor, as
// an HTTP header, or nil when there are none.
func (s *Server) httpHeader(hds []headers.Decision, failWait time.Duration, overall pb.RateLimitResponse_Code) http.Header {
	if len(hds) == 0 && failWait == 0 {
		return nil
	}
	h := make(http.Header, 3)
	s.writeHeader(h, nil, hds, failWait, overall)
	return h
}

// writeHeader writes the header fields of hds into h, their slices in vals
// when it is not nil (headers.Values.Write). A set's limits are among hds,
// the one that decided standing for the others (set.go). failWait, when
// positive, is the wait of a rule that failed closed: Retry-After is at
// least that.
func (s *Server) writeHeader(h http.Header, vals *headers.Values, hds []headers.Decision, failWait time.Duration, overall pb.RateLimitResponse_Code) {
	if overall == pb.RateLimitResponse_OK {
		// The global dry run or quota_mode let the request through:
		// no Retry-After for a request that passes.
		for i := range hds {
			hds[i].Result.Allowed = true
		}
	}
	// The clock is read only for X-RateLimit-Reset, the one field that
	// is a moment rather than a duration.
	var now time.Time
	if s.hdr.flavor&headers.XRateLimit != 0 {
		now = s.now()
	}
	if vals != nil {
		vals.Write(h, s.hdr.flavor, now, hds...)
	} else {
		headers.Write(h, s.hdr.flavor, now, hds...)
	}
	if failWait > 0 {
		// The longest wait wins: the store's for a denial, or the guess
		// at when the store is back.
		if b := headers.Binding(hds); b >= 0 && !hds[b].Result.Allowed {
			failWait = max(failWait, hds[b].Result.RetryAfter)
		}
		headers.SetRetryAfter(h, failWait)
	}
	if s.envoy.compat {
		h.Del("Retry-After") // envoy's answers carry none
	}
	for field, name := range s.hdr.names {
		if v, ok := h[field]; ok {
			delete(h, field)
			h[http.CanonicalHeaderKey(name)] = v
		}
	}
}

// scratch is what addHeaders writes the header fields into and empties
// again: a map, and room for its slices. The fields' values (strings)
// outlive both, which are only a way to them.
type scratch struct {
	h    http.Header
	vals headers.Values
}

// scratchHeaders holds addHeaders' scratch between responses.
var scratchHeaders = sync.Pool{New: func() any { return &scratch{h: make(http.Header, len(headerOrder))} }}

// addHeaders writes the header fields of hds into p's response as
// response_headers_to_add, in headerOrder, making them in p's room where
// there is enough.
func (s *Server) addHeaders(p *parts, hds []headers.Decision, failWait time.Duration, overall pb.RateLimitResponse_Code) {
	if len(hds) == 0 && failWait == 0 {
		return
	}
	sc := scratchHeaders.Get().(*scratch)
	h := sc.h
	s.writeHeader(h, &sc.vals, hds, failWait, overall)
	n := len(h)
	if n > cap(p.hdrs) {
		p.hdrs, p.hdrPtrs = make([]core.HeaderValue, 0, n), make([]*core.HeaderValue, 0, n)
	}
	for i := 0; i < len(s.hdr.wire) && len(p.hdrs) < n; i++ { // the draft's fields come first: two lookups
		if v := h[s.hdr.wire[i].key]; len(v) > 0 {
			p.hdrs = append(p.hdrs, core.HeaderValue{Key: s.hdr.wire[i].wire, Value: v[0]})
			p.hdrPtrs = append(p.hdrPtrs, &p.hdrs[len(p.hdrs)-1])
		}
	}
	clear(h)
	sc.vals = headers.Values{}
	scratchHeaders.Put(sc)
	if len(p.hdrPtrs) > 0 {
		p.resp.ResponseHeadersToAdd = p.hdrPtrs
	}
}
