package service

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

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
		req, missing := hr.request(hr.domain, hr.specs, r, path, r.Method)
		s.leftOut(apiProxy, hr.domain, missing)
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
	if _, ok := h["Retry-After"]; !ok {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(http.StatusTooManyRequests)
	retry := w.Header().Get("Retry-After")
	instance, _ := json.Marshal(r.URL.Path)
	io.WriteString(w, `{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"rate limit exceeded; retry after `+retry+` s","instance":`+string(instance)+`}`)
}
