package service

import (
	"unicode/utf8"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// rlsCodec is the gRPC server's codec (GRPCServerOptions): proto's, with
// the two messages of every call read and written directly in the wire
// format — a RateLimitRequest of descriptors of entries, and a
// RateLimitResponse of statuses and header fields — without proto's
// reflection over the message's fields, which took a tenth of the
// service's CPU a call. Anything else (other services' messages, a request
// with override limits, hits_addend per descriptor or fields this version
// does not know, a response with metadata or quotas, a string that is not
// UTF-8) goes through proto's codec, whole: the messages, and the errors of
// those that do not decode or encode, are proto's.
type rlsCodec struct{ proto encoding.CodecV2 }

func newRLSCodec() rlsCodec { return rlsCodec{proto: encoding.GetCodecV2(grpcproto.Name)} }

// Name is proto's: the calls stay application/grpc calls.
func (rlsCodec) Name() string { return grpcproto.Name }

// Marshal encodes v; a RateLimitResponse the encoder covers (responseSize)
// goes into one buffer of its exact size.
func (c rlsCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*pb.RateLimitResponse); ok {
		if n, ok := responseSize(r); ok {
			return mem.BufferSlice{mem.SliceBuffer(appendResponse(make([]byte, 0, n), r))}, nil
		}
	}
	return c.proto.Marshal(v)
}

// Unmarshal decodes data into v; a RateLimitRequest that came in one buffer
// is read directly when it holds only what decodeRequest reads, and by
// proto otherwise.
func (c rlsCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*pb.RateLimitRequest); ok && len(data) == 1 {
		if decodeRequest(data[0].ReadOnlyData(), r) {
			return nil
		}
	}
	return c.proto.Unmarshal(data, v)
}

// decodeRequest reads b, a RateLimitRequest in the wire format, into r, a
// new one, as proto would. It reads the domain, the hits_addend and
// descriptors of entries alone, and reports false, leaving r untouched,
// for anything else: another field, a field of another wire type, a string
// that is not UTF-8 (proto3 refuses it) or bytes that are not a message.
//
// It reads b twice: once to check it and count its parts (scanRequest),
// then to fill them in, all made at once — the descriptors in one slice,
// the entries in another, or, for the usual request of one descriptor of
// one entry, both in one allocation (oneDescriptor) — and its strings cut
// from one string when they are short together (shortStrings), so that a
// string kept from the request keeps no more than that alive.
func decodeRequest(b []byte, r *pb.RateLimitRequest) bool {
	var sh requestShape
	if !scanRequest(b, &sh) {
		return false
	}
	var (
		descs []rlv3.RateLimitDescriptor
		dptrs []*rlv3.RateLimitDescriptor
		ents  []rlv3.RateLimitDescriptor_Entry
		eptrs []*rlv3.RateLimitDescriptor_Entry
	)
	if sh.descs == 1 && sh.entries == 1 {
		o := new(oneDescriptor)
		descs, dptrs, ents, eptrs = o.desc[:], o.dptr[:], o.entry[:], o.eptr[:]
	} else if sh.descs > 0 {
		descs, dptrs = make([]rlv3.RateLimitDescriptor, sh.descs), make([]*rlv3.RateLimitDescriptor, sh.descs)
		if sh.entries > 0 {
			ents, eptrs = make([]rlv3.RateLimitDescriptor_Entry, sh.entries), make([]*rlv3.RateLimitDescriptor_Entry, sh.entries)
		}
	}
	strs := stringSource{}
	if sh.short {
		strs.all = string(sh.strs[:sh.nstrs])
	}
	di, ei := 0, 0
	for len(b) > 0 {
		num, _, n := protowire.ConsumeTag(b)
		b = b[n:]
		switch num {
		case 1:
			v, n := protowire.ConsumeBytes(b)
			r.Domain, b = strs.take(v), b[n:]
		case 2:
			v, n := protowire.ConsumeBytes(b)
			b = b[n:]
			d, first := &descs[di], ei
			dptrs[di] = d
			di++
			for len(v) > 0 {
				_, _, n := protowire.ConsumeTag(v)
				ev, m := protowire.ConsumeBytes(v[n:])
				v = v[n+m:]
				e := &ents[ei]
				eptrs[ei] = e
				ei++
				for len(ev) > 0 {
					num, _, n := protowire.ConsumeTag(ev)
					s, m := protowire.ConsumeBytes(ev[n:])
					ev = ev[n+m:]
					if num == 1 {
						e.Key = strs.take(s)
					} else {
						e.Value = strs.take(s)
					}
				}
			}
			if ei > first {
				d.Entries = eptrs[first:ei:ei]
			}
		case 3:
			v, n := protowire.ConsumeVarint(b)
			r.HitsAddend, b = uint32(v), b[n:]
		}
	}
	if di > 0 {
		r.Descriptors = dptrs
	}
	return true
}

// shortStrings is the most bytes of strings a request's strings may have
// together to be cut from one string.
const shortStrings = 256

// oneDescriptor is the usual request's one descriptor of one entry.
type oneDescriptor struct {
	desc  [1]rlv3.RateLimitDescriptor
	entry [1]rlv3.RateLimitDescriptor_Entry
	dptr  [1]*rlv3.RateLimitDescriptor
	eptr  [1]*rlv3.RateLimitDescriptor_Entry
}

// requestShape is what scanRequest found in a request: its descriptors and
// entries, and its strings' bytes in the order they come while short.
type requestShape struct {
	descs, entries int
	strs           [shortStrings]byte
	nstrs          int
	short          bool // the strings' bytes are all in strs[:nstrs]
}

// scanRequest checks that b holds only what decodeRequest reads, and
// counts it into sh.
func scanRequest(b []byte, sh *requestShape) bool {
	sh.short = true
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 || !sh.addString(v) {
				return false
			}
			n = m
		case num == 2 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 || !scanDescriptor(v, sh) {
				return false
			}
			sh.descs++
			n = m
		case num == 3 && typ == protowire.VarintType:
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return false
			}
		default:
			return false
		}
		b = b[n:]
	}
	return true
}

// scanDescriptor checks a RateLimitDescriptor of entries alone, and counts
// it into sh.
func scanDescriptor(b []byte, sh *requestShape) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num != 1 || typ != protowire.BytesType {
			return false
		}
		b = b[n:]
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return false
		}
		for len(v) > 0 {
			num, typ, m := protowire.ConsumeTag(v)
			if m < 0 || (num != 1 && num != 2) || typ != protowire.BytesType {
				return false
			}
			v = v[m:]
			s, m := protowire.ConsumeBytes(v)
			if m < 0 || !sh.addString(s) {
				return false
			}
			v = v[m:]
		}
		sh.entries++
		b = b[n:]
	}
	return true
}

// addString takes note of a string of the request, and reports whether it
// is UTF-8.
func (sh *requestShape) addString(s []byte) bool {
	if !utf8.Valid(s) {
		return false
	}
	if sh.short {
		if sh.nstrs+len(s) > shortStrings {
			sh.short = false
		} else {
			sh.nstrs += copy(sh.strs[sh.nstrs:], s)
		}
	}
	return true
}

// stringSource gives the strings of a request in the order they come: cut
// from all, which holds them all, or else each one its own.
type stringSource struct {
	all string
	off int
}

func (s *stringSource) take(b []byte) string {
	if s.all == "" {
		return string(b)
	}
	v := s.all[s.off : s.off+len(b)]
	s.off += len(b)
	return v
}

// responseSize returns the size of r in the wire format, and false when r
// has what appendResponse does not write: request header fields, a raw
// body, dynamic metadata, quotas, a unit multiplier, unknown fields, a
// missing status or header field, or a string that is not UTF-8 (which
// proto refuses to encode).
func responseSize(r *pb.RateLimitResponse) (int, bool) {
	if len(r.RequestHeadersToAdd) > 0 || len(r.RawBody) > 0 || r.DynamicMetadata != nil || r.Quota != nil || unknown(r) {
		return 0, false
	}
	n := 0
	if r.OverallCode != 0 {
		n += 1 + protowire.SizeVarint(uint64(r.OverallCode))
	}
	for _, s := range r.Statuses {
		if s == nil || s.Quota != nil || unknown(s) {
			return 0, false
		}
		if l := s.CurrentLimit; l != nil && (l.UnitMultiplier != nil || unknown(l) || !utf8.ValidString(l.Name)) {
			return 0, false
		}
		if d := s.DurationUntilReset; d != nil && unknown(d) {
			return 0, false
		}
		n += 1 + protowire.SizeBytes(statusSize(s))
	}
	for _, h := range r.ResponseHeadersToAdd {
		if h == nil || unknown(h) || !utf8.ValidString(h.Key) || !utf8.ValidString(h.Value) {
			return 0, false
		}
		n += 1 + protowire.SizeBytes(headerSize(h))
	}
	return n, true
}

func unknown(m proto.Message) bool { return len(m.ProtoReflect().GetUnknown()) > 0 }

// The sizes of the parts of a response that responseSize accepted.

func statusSize(s *pb.RateLimitResponse_DescriptorStatus) int {
	n := 0
	if s.Code != 0 {
		n += 1 + protowire.SizeVarint(uint64(s.Code))
	}
	if l := s.CurrentLimit; l != nil {
		n += 1 + protowire.SizeBytes(limitSize(l))
	}
	if s.LimitRemaining != 0 {
		n += 1 + protowire.SizeVarint(uint64(s.LimitRemaining))
	}
	if d := s.DurationUntilReset; d != nil {
		n += 1 + protowire.SizeBytes(durationSize(d))
	}
	return n
}

func limitSize(l *pb.RateLimitResponse_RateLimit) int {
	n := 0
	if l.RequestsPerUnit != 0 {
		n += 1 + protowire.SizeVarint(uint64(l.RequestsPerUnit))
	}
	if l.Unit != 0 {
		n += 1 + protowire.SizeVarint(uint64(l.Unit))
	}
	if l.Name != "" {
		n += 1 + protowire.SizeBytes(len(l.Name))
	}
	return n
}

func durationSize(d *durationpb.Duration) int {
	n := 0
	if d.Seconds != 0 {
		n += 1 + protowire.SizeVarint(uint64(d.Seconds))
	}
	if d.Nanos != 0 {
		n += 1 + protowire.SizeVarint(uint64(int64(d.Nanos)))
	}
	return n
}

func headerSize(h *core.HeaderValue) int {
	n := 0
	if h.Key != "" {
		n += 1 + protowire.SizeBytes(len(h.Key))
	}
	if h.Value != "" {
		n += 1 + protowire.SizeBytes(len(h.Value))
	}
	if len(h.RawValue) > 0 {
		n += 1 + protowire.SizeBytes(len(h.RawValue))
	}
	return n
}

// appendResponse appends r, which responseSize accepted, in the wire
// format, its fields in the order of their numbers as proto writes them.
func appendResponse(b []byte, r *pb.RateLimitResponse) []byte {
	if r.OverallCode != 0 {
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(r.OverallCode))
	}
	for _, s := range r.Statuses {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(statusSize(s)))
		b = appendStatus(b, s)
	}
	for _, h := range r.ResponseHeadersToAdd {
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(headerSize(h)))
		if h.Key != "" {
			b = protowire.AppendTag(b, 1, protowire.BytesType)
			b = protowire.AppendString(b, h.Key)
		}
		if h.Value != "" {
			b = protowire.AppendTag(b, 2, protowire.BytesType)
			b = protowire.AppendString(b, h.Value)
		}
		if len(h.RawValue) > 0 {
			b = protowire.AppendTag(b, 3, protowire.BytesType)
			b = protowire.AppendBytes(b, h.RawValue)
		}
	}
	return b
}

func appendStatus(b []byte, s *pb.RateLimitResponse_DescriptorStatus) []byte {
	if s.Code != 0 {
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(s.Code))
	}
	if l := s.CurrentLimit; l != nil {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(limitSize(l)))
		if l.RequestsPerUnit != 0 {
			b = protowire.AppendTag(b, 1, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(l.RequestsPerUnit))
		}
		if l.Unit != 0 {
			b = protowire.AppendTag(b, 2, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(l.Unit))
		}
		if l.Name != "" {
			b = protowire.AppendTag(b, 3, protowire.BytesType)
			b = protowire.AppendString(b, l.Name)
		}
	}
	if s.LimitRemaining != 0 {
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(s.LimitRemaining))
	}
	if d := s.DurationUntilReset; d != nil {
		b = protowire.AppendTag(b, 4, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(durationSize(d)))
		if d.Seconds != 0 {
			b = protowire.AppendTag(b, 1, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(d.Seconds))
		}
		if d.Nanos != 0 {
			b = protowire.AppendTag(b, 2, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(int64(d.Nanos)))
		}
	}
	return b
}
