package service

import (
	"log/slog"
	"sync/atomic"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/service/config"
)

// snapshot is the rules in force and what the server keeps per rule.
type snapshot struct {
	rules *config.Rules
	per   []ruleState // by Rule.Index
}

// ruleState is what the server keeps of one rule while it is in force,
// worked out once in SetRules rather than on every request.
type ruleState struct {
	rule   *config.Rule
	point  engine.Point                    // the rule as the engine sees it
	envoy  envoyCounters                   // envoy's statistics of the rule
	limit  *pb.RateLimitResponse_RateLimit // shared by every response: read-only
	rolled *ruleState                      // of rule.Rolled, for a rule with a rollout
	set    []setState                      // of rule.Set's limits, for a rule of several (set.go)
	// counters are made on first use, so that /metrics shows only the
	// outcomes a rule has had.
	counters [numOutcomes]atomic.Pointer[prometheus.Counter]
}

// counter is the rule's tollgate_serve_decisions_total child of outcome o.
func (st *ruleState) counter(m *metrics, o engine.Outcome) prometheus.Counter {
	if c := st.counters[o].Load(); c != nil {
		return *c
	}
	c := m.decisions.WithLabelValues(st.rule.Domain, st.rule.ID, decisionLabels[o])
	st.counters[o].Store(&c)
	return c
}

// Rules returns the rules in force, or nil.
func (s *Server) Rules() *config.Rules {
	if sn := s.snap.Load(); sn != nil {
		return sn.rules
	}
	return nil
}

// SetRules swaps rules in: requests already in flight finish with the
// rules they started with.
func (s *Server) SetRules(rules *config.Rules) {
	all := rules.All()
	sn := &snapshot{rules: rules, per: make([]ruleState, len(all))}
	for i, r := range all {
		st := &sn.per[i]
		st.rule = r
		st.point = s.point(r)
		switch {
		case r.Set != nil:
			st.set = newSetState(r)
		case r.Concurrency != nil:
			// No unit: requests_per_unit is how many may be in flight.
			st.limit = &pb.RateLimitResponse_RateLimit{Name: r.Name, RequestsPerUnit: uint32(r.Concurrency.Max)}
		case !r.Unlimited:
			st.limit = &pb.RateLimitResponse_RateLimit{Name: r.Name, RequestsPerUnit: r.RequestsPerUnit, Unit: pb.RateLimitResponse_RateLimit_Unit(r.Unit)}
			st.rolled = s.rolledState(r)
		}
	}
	s.snap.Store(sn)
	if s.sink != nil {
		s.sink.ConfigLoad(true)
	}
	s.m.rules.Set(float64(len(all)))
	s.m.lastReload.Set(float64(s.now().UnixNano()) / 1e9)
	s.updateReady()
}

// Reload loads the rules at path (a file or a directory) and swaps them in.
// When they do not load — a syntax error, an unknown key, an invalid value
// — the rules in force stay, the failure is logged with every problem
// found and counted, and the error is returned. Rules identical to those in
// force are not swapped. Reload is what SIGHUP and a file change call.
func (s *Server) Reload(path string) error {
	return s.update(slog.String("path", path), func() (*config.Rules, error) { return config.Load(path, s.loadOpts...) })
}

// Update swaps in the rules that load returns, from a source other than
// files (source says which, in the logs: the rules pushed by an xDS
// management server), exactly as Reload does: counted in the same metric,
// logged in the same words, the rules in force kept on a failure, which is
// returned.
func (s *Server) Update(source string, load func() (*config.Rules, error)) error {
	return s.update(slog.String("source", source), load)
}

func (s *Server) update(from slog.Attr, load func() (*config.Rules, error)) error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	rules, err := load()
	if err != nil {
		s.m.reloads[reloadFailure].Inc()
		if s.sink != nil {
			s.sink.ConfigLoad(false)
		}
		if ok, skipped := s.reloadFails.allow(err.Error(), s.logEvery, s.now()); ok {
			s.log.Error("rules not loaded; the previous rules stay in force", from, slog.String("error", err.Error()), engine.Skipped(skipped))
		}
		return err
	}
	s.reloadFails.last = ""
	if rules.Same(s.Rules()) {
		s.m.reloads[reloadUnchanged].Inc()
		if s.sink != nil {
			s.sink.ConfigLoad(true) // envoy loads them again
		}
		return nil
	}
	s.SetRules(rules)
	s.m.reloads[reloadSuccess].Inc()
	s.log.Info("rules loaded", from, "files", len(rules.Files()), "domains", rules.Domains(), "rules", len(rules.All()))
	return nil
}

// failureLog samples the log of failed loads: the same failure again —
// rewritten files of one mistake, or a management server resending the
// config it was told is refused, thousands of times a second — is logged
// at most once per interval, with how many were left out; a different
// one at once. It is guarded by reloadMu.
type failureLog struct {
	last    string    // the previous failure's message; "" after a success
	next    time.Time // when it may be logged again
	skipped int       // failures not logged since the last that was
}

// allow reports whether the failure msg at now is to be logged and, when
// it is, how many were left out before it.
func (f *failureLog) allow(msg string, every time.Duration, now time.Time) (ok bool, skipped int) {
	if msg == f.last && now.Before(f.next) {
		f.skipped++
		return false, 0
	}
	f.last, f.next = msg, now.Add(every)
	skipped, f.skipped = f.skipped, 0
	return true, skipped
}

// point is rule r as the engine sees it: its failure mode (the server's
// when r has none), dry run, and the server's store metrics.
func (s *Server) point(r *config.Rule) engine.Point {
	mode := r.FailureMode
	if mode == enforce.FailDefault {
		mode = s.failMode
	}
	return engine.Point{Rule: r.ID, Mode: mode, DryRun: r.DryRun,
		Latency: s.m.storeDuration, Errors: s.m.storeErrors[storeError], Timeouts: s.m.storeErrors[storeTimeout], Skipped: s.m.storeSkipped}
}
