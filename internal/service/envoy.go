package service

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http/httpguts"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/service/config"
)

// What an envoyproxy/ratelimit deployment relies on beyond the protocol:
// its statistics (envoystats.go), its global quota mode, its response
// header names, its dynamic metadata, and a switch for where tollgate
// decides differently on purpose.

// envoyWays are the envoyproxy/ratelimit behaviours the options turn on.
type envoyWays struct {
	compat         bool    // answer exactly as envoy does (WithEnvoyCompat)
	quotaMode      bool    // every rule a quota rule (WithQuotaMode)
	metadata       bool    // dynamic metadata in gRPC answers (WithResponseMetadata)
	nearLimitRatio float64 // where near_limit starts (WithNearLimitRatio)
}

// WithEnvoyCompat makes the server answer exactly as envoyproxy/ratelimit
// does where tollgate differs on purpose:
//
//   - a descriptor over the limit reports limit_remaining 0, and so do
//     the header fields (tollgate otherwise reports what is left, which a
//     request of fewer hits could still have);
//   - denied hits are counted: a request denied while some of the limit
//     was left spends what was left, so that, as in envoy, nothing more
//     passes until the counter resets (envoy's counter goes past the limit;
//     for its fixed windows the admissions are the same);
//   - no Retry-After among the response headers (envoy sends the three
//     RateLimit-Limit/-Remaining/-Reset fields only).
func WithEnvoyCompat(on bool) Option { return func(s *Server) { s.envoy.compat = on } }

// WithQuotaMode turns every rule into a quota rule (envoy's global
// QUOTA_MODE): the request is over the limit only when every quota rule
// it touches is.
func WithQuotaMode(on bool) Option { return func(s *Server) { s.envoy.quotaMode = on } }

// WithNearLimitRatio sets the share of a limit past which hits count as
// near_limit in ratelimit_service_rate_limit_near_limit (default
// DefaultNearLimitRatio, envoy's NEAR_LIMIT_RATIO); 0 < ratio ≤ 1.
func WithNearLimitRatio(ratio float64) Option {
	return func(s *Server) { s.envoy.nearLimitRatio = ratio }
}

// WithResponseMetadata adds to every gRPC answer the dynamic metadata
// envoyproxy/ratelimit adds with RESPONSE_DYNAMIC_METADATA: the request's
// domain, its descriptors (entries as "key=value", an override limit, a
// hits_addend) and its hits_addend, for Envoy's access logs and later
// filters. It carries descriptor values, API keys among them: turn it on
// only where those may be logged.
func WithResponseMetadata(on bool) Option { return func(s *Server) { s.envoy.metadata = on } }

// WithHeaderNames renames the fields of the headers.RateLimitFields
// flavour (RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset), as
// envoy's LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and
// LIMIT_RESET_HEADER do; an empty name keeps the field's own.
func WithHeaderNames(limit, remaining, reset string) Option {
	return func(s *Server) {
		for field, name := range map[string]string{"Ratelimit-Limit": limit, "Ratelimit-Remaining": remaining, "Ratelimit-Reset": reset} {
			if name == "" {
				continue
			}
			if s.hdr.names == nil {
				s.hdr.names = map[string]string{}
			}
			s.hdr.names[field] = name
		}
	}
}

func (s *Server) checkEnvoyOptions() error {
	if !(s.envoy.nearLimitRatio > 0 && s.envoy.nearLimitRatio <= 1) {
		return fmt.Errorf("server: near-limit ratio %v: want 0 < ratio ≤ 1", s.envoy.nearLimitRatio)
	}
	seen := map[string]bool{}
	for _, name := range s.hdr.names {
		if !httpguts.ValidHeaderFieldName(name) {
			return fmt.Errorf("server: header name %q is not a valid HTTP field name", name)
		}
		if c := http.CanonicalHeaderKey(name); seen[c] {
			return errors.New("server: two rate-limit headers renamed to " + name)
		} else {
			seen[c] = true
		}
	}
	return nil
}

// spendDenied spends, in envoy compatibility, what was left of r's limit
// when a request over it was denied (res): envoy counts denied hits, so
// nothing passes until the counter resets. What the store answers does
// not change the request's answer.
func (s *Server) spendDenied(q *engine.Request, p *engine.Point, key string, r *config.Rule, res tollgate.Result) {
	if res.Remaining > 0 {
		q.Spend(p, "", key, r.Limit, min(int(res.Remaining), r.Limit.Capacity()))
	}
}

// requestMetadata is envoy's dynamic metadata of req: domain, descriptors
// and hits_addend, and the metadata of the rules it passed when there is
// any (passedMetadata).
func requestMetadata(req *pb.RateLimitRequest, passed *structpb.Struct) *structpb.Struct {
	descs := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, d := range req.GetDescriptors() {
		entries := make([]*structpb.Value, 0, len(d.GetEntries()))
		for _, e := range d.GetEntries() {
			entries = append(entries, structpb.NewStringValue(e.GetKey()+"="+e.GetValue()))
		}
		f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if l := d.GetLimit(); l != nil {
			f["limit"] = structpb.NewStringValue(strings.TrimSpace(l.String()))
		}
		if h := d.GetHitsAddend(); h != nil {
			f["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		descs = append(descs, structpb.NewStructValue(&structpb.Struct{Fields: f}))
	}
	fields := map[string]*structpb.Value{
		"domain":      structpb.NewStringValue(req.GetDomain()),
		"descriptors": structpb.NewListValue(&structpb.ListValue{Values: descs}),
	}
	if h := req.GetHitsAddend(); h != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	if passed != nil {
		fields["metadata"] = structpb.NewStructValue(passed)
	}
	return &structpb.Struct{Fields: fields}
}

// passedMetadata is the metadata of the rules of the descriptors answered
// OK (statuses), merged in the request's order as envoyproxy/ratelimit
// merges them: a key already there keeps its value, but two mappings under
// one key are merged the same way. A descriptor over its limit, of an
// unlimited or replaced rule, or without a rule adds nothing. It is nil
// when no rule adds any. The rules' own metadata is shared by every answer
// and never changed: a merge copies each mapping it adds to.
func passedMetadata(items []item, statuses []*pb.RateLimitResponse_DescriptorStatus) *structpb.Struct {
	var out *structpb.Struct
	owned := false // out is a copy of ours, not a rule's
	for i := range items {
		r := items[i].rule
		if r == nil || r.Metadata == nil || items[i].dropped || r.Unlimited || statuses[i].GetCode() != pb.RateLimitResponse_OK {
			continue
		}
		if out == nil {
			out = r.Metadata // the usual answer: one rule's, as it is
			continue
		}
		if !owned {
			out, owned = shallowCopy(out), true
		}
		mergeMetadata(out, r.Metadata)
	}
	return out
}

// mergeMetadata adds to dst, a mapping of ours, what src has that it has
// not, and merges the mappings both have under one key into copies.
func mergeMetadata(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		have, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = v
			continue
		}
		d, s := have.GetStructValue(), v.GetStructValue()
		if d == nil || s == nil {
			continue // the first value stays
		}
		c := shallowCopy(d)
		mergeMetadata(c, s)
		dst.Fields[k] = structpb.NewStructValue(c)
	}
}

func shallowCopy(s *structpb.Struct) *structpb.Struct {
	return &structpb.Struct{Fields: maps.Clone(s.GetFields())}
}
