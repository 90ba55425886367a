package service

import (
	"strings"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// Envoy's rate limit filter calls the service twice for a request whose
// route has rate limits of both kinds: when the request starts, with the
// descriptors of the route's ordinary rate limits, and when its stream is
// done, with those of the rate limits marked apply_on_stream_done, whose
// hits_addend may come from the response (a format such as
// %DYNAMIC_METADATA(...)%). Both are plain ShouldRateLimit calls; Envoy
// ignores the answer to the second. A route tells the service which call
// is which, and which request a call belongs to, with two entries that the
// service takes out of a descriptor before matching it to a rule or naming
// its counter, so that both calls meet the same rule and counter:
const (
	// PhaseKey is the key of the entry that says which call a descriptor
	// belongs to: its value is PhaseRequest (the same as no such entry) or
	// PhaseStreamDone. A route's stream-done rate limit adds it with a
	// generic_key action {descriptor_key: tollgate.phase,
	// descriptor_value: stream_done}. Any other value is an invalid
	// request.
	PhaseKey = "tollgate.phase"
	// PhaseRequest marks the call made when the request starts.
	PhaseRequest = "request"
	// PhaseStreamDone marks the call made when the stream is done. For a
	// rate rule it charges the descriptor's hits (its hits_addend, else the
	// request's) to the counter, even past what is left, instead of
	// deciding: the work is done, and what it cost must count. For a
	// concurrency rule it releases the request's slot.
	PhaseStreamDone = "stream_done"
	// PermitKey is the key of the entry that names the request for a
	// concurrency rule, so that the stream-done call releases the slot the
	// request-start call took, on whichever replica it arrives: a request_headers
	// action {header_name: x-request-id, descriptor_key: tollgate.permit}.
	// The slot is named tollgate.PermitID(value). Rate rules ignore it.
	PermitKey = "tollgate.permit"
)

// phase is which call of a request a descriptor belongs to.
type phase uint8

const (
	phaseRequest phase = iota
	phaseStreamDone
)

// mark is what a descriptor's PhaseKey and PermitKey entries said.
type mark struct {
	phase  phase
	permit string // the PermitKey value; "" when none
}

// reservedPrefix starts both reserved keys: a descriptor whose keys do not
// start with it is passed on as it came, without a copy.
const reservedPrefix = "tollgate."

// streamDone reports whether entries mark a stream-done call.
func streamDone(entries []*rlv3.RateLimitDescriptor_Entry) bool {
	for _, e := range entries {
		if e.GetKey() == PhaseKey && e.GetValue() == PhaseStreamDone {
			return true
		}
	}
	return false
}

func hasReserved(entries []*rlv3.RateLimitDescriptor_Entry) bool {
	for _, e := range entries {
		if k := e.GetKey(); strings.HasPrefix(k, reservedPrefix) && (k == PhaseKey || k == PermitKey) {
			return true
		}
	}
	return false
}
