package service

import (
	"hash/maphash"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/service/config"
)

// A descriptor that matches no rule is answered OK, as in
// envoyproxy/ratelimit: a gateway sends descriptors for every action of a
// route, and only some of them need a limit. But a typo in a rules file's
// key or in a gateway's domain turns limiting off the same way, without a
// word. So each kind of unmatched descriptor — its reason, domain and
// entry keys — is logged at WARN: the first at once, then at most once per
// log interval (WithLogInterval), each record saying how many of that kind
// were left out since the previous one (similar_events_not_logged).
//
// A record names the domain and the descriptor's keys, never its values:
// values are API keys, tokens, client addresses and user names, and even a
// few bytes of one are a piece of a credential. The keys are what a typo
// in a rule or a gateway's configuration changes; a value that no rule
// names shows as a known set of keys that matched nothing.
//
// What a client sends is bounded on the way: a domain and each key are
// logged up to maxLoggedName bytes, at most maxUnmatchedKinds kinds are
// remembered (a few tens of kilobytes), and past them the new kinds share
// one sample, so that a flood of invented keys costs one record per
// interval.
const (
	maxUnmatchedKinds = 256
	maxLoggedName     = 64
	maxLoggedDomains  = 8 // of the rules' domains, named with an unknown one
)

// unmatchedLog samples the records of unmatched descriptors by kind.
type unmatchedLog struct {
	every time.Duration
	seed  maphash.Seed

	mu    sync.Mutex
	kinds map[uint64]*unmatchedKind
	swept time.Time     // when kinds was last cleared of kinds due again
	other unmatchedKind // the kinds that find kinds full
}

// unmatchedKind is when a kind may next be logged, and how many of it were
// left out since it last was.
type unmatchedKind struct {
	next    time.Time
	skipped int
}

// allow reports whether a descriptor of domain with entries, unmatched for
// reason, is to be logged at now and, if so, how many of its kind were
// left out before it. It allocates nothing but a kind's first time.
func (l *unmatchedLog) allow(now time.Time, reason int, domain string, entries []*rlv3.RateLimitDescriptor_Entry) (bool, int) {
	if l.every <= 0 {
		return true, 0
	}
	var h maphash.Hash
	h.SetSeed(l.seed)
	h.WriteByte(byte(reason))
	h.WriteString(domain)
	for _, e := range entries {
		h.WriteByte(0)
		h.WriteString(e.GetKey())
	}
	k := h.Sum64()
	l.mu.Lock()
	defer l.mu.Unlock()
	kind := l.kinds[k]
	if kind == nil {
		kind = l.add(now, k)
	}
	if now.Before(kind.next) {
		kind.skipped++
		return false, 0
	}
	kind.next = now.Add(l.every)
	skipped := kind.skipped
	kind.skipped = 0
	return true, skipped
}

// add makes room for kind k, first seen at now, and returns it: a kind of
// its own while there is room, else the shared one. A full table is
// cleared of the kinds that are due again (their next record would be
// logged at once anyway; the count of those left out of it goes with
// them) at most once per interval.
func (l *unmatchedLog) add(now time.Time, k uint64) *unmatchedKind {
	if l.kinds == nil {
		l.kinds = make(map[uint64]*unmatchedKind)
	}
	if len(l.kinds) >= maxUnmatchedKinds && !now.Before(l.swept.Add(l.every)) {
		l.swept = now
		for k, kind := range l.kinds {
			if !now.Before(kind.next) {
				delete(l.kinds, k)
			}
		}
	}
	if len(l.kinds) >= maxUnmatchedKinds {
		return &l.other
	}
	kind := &unmatchedKind{}
	l.kinds[k] = kind
	return kind
}

// logUnmatched logs a descriptor of entries in domain that came via and
// matched no rule in force (rules, nil when there are none) for reason
// (noRuleDomain or noRuleMatch), as unmatchedLog samples it. A record of an
// unknown domain names the rules' domains too.
func (s *Server) logUnmatched(via api, reason int, domain string, entries []*rlv3.RateLimitDescriptor_Entry, rules *config.Rules) {
	ok, skipped := s.unmatched.allow(s.now(), reason, domain, entries)
	if !ok {
		return
	}
	keys := make([]string, len(entries))
	for i, e := range entries {
		keys[i] = clip(e.GetKey())
	}
	if reason == noRuleDomain {
		var known []string
		if rules != nil {
			known = rules.DomainNames()
		}
		if len(known) > maxLoggedDomains {
			known = append(known[:maxLoggedDomains:maxLoggedDomains], "…")
		}
		s.log.Warn("unknown domain: descriptor answered OK without a limit", "api", via.String(), "domain", clip(domain),
			"keys", strings.Join(keys, ","), "domains", known, engine.Skipped(skipped))
		return
	}
	s.log.Warn("no rule matches the descriptor: answered OK without a limit", "api", via.String(), "domain", clip(domain),
		"keys", strings.Join(keys, ","), engine.Skipped(skipped))
}

// leftOut counts and logs, sampled as unmatched descriptors are, the
// descriptors of an /auth or proxy request that were left out because a
// value they need was empty (missing): a client that leaves out the
// header a limit is keyed by is not limited by it, so that must not pass
// unseen. A rule keyed by the client's address beside it limits such
// requests too. The record names the keys and where the missing value
// comes from (a header's name), never a value.
func (s *Server) leftOut(via api, domain string, missing []missingValue) {
	for _, m := range missing {
		s.m.noRule[noRuleMissing].Inc()
		entries := make([]*rlv3.RateLimitDescriptor_Entry, len(m.spec))
		keys := make([]string, len(m.spec))
		for i, e := range m.spec {
			entries[i] = &rlv3.RateLimitDescriptor_Entry{Key: e.key}
			keys[i] = e.key
		}
		ok, skipped := s.unmatched.allow(s.now(), noRuleMissing, domain, entries)
		if !ok {
			continue
		}
		s.log.Warn("a value the descriptor needs is missing: descriptor left out, answered without its limit", "api", via.String(),
			"domain", clip(domain), "keys", strings.Join(keys, ","), "missing", clip(m.spec.sourceName(m.i)), engine.Skipped(skipped))
	}
}

// clip cuts a name a client sent to maxLoggedName bytes, at a rune
// boundary, marking the cut with "…".
func clip(s string) string {
	if len(s) <= maxLoggedName {
		return s
	}
	i := maxLoggedName
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}
