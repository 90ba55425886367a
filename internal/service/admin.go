package service

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/tollgate/tollgate/internal/door/engine"
	"github.com/tollgate/tollgate/internal/door/rollout"
	"github.com/tollgate/tollgate/internal/door/storekey"
	"github.com/tollgate/tollgate/internal/service/config"
)

// The admin API lets an operator look at one counter and reset it, by the
// domain and descriptor a gateway would send:
//
//	GET  /v1/counter?domain=api&entry=tenant=acme   where the counter stands
//	POST /v1/counter/reset?domain=api&entry=tenant=acme
//
// entry is key=value (the first '=' ends the key), repeated in the
// descriptor's order. A look spends nothing (a cost-0 call); a reset
// deletes the counter and, for a rule with a penalty or a rollout, the
// penalty's, its denials' and the shadow's states. A rule of several
// limits shows, and resets, each of them ("limits").
//
// Every call needs "Authorization: Bearer TOKEN" with one of the tokens
// given to AdminHandler, each under a name: the name, never the token, is
// logged with every reset and every refused call, with the rule and the
// descriptor's keys, and the counter key's SHA-256 (its values may be
// credentials, so they are not logged). A query is at most
// maxAdminQuery bytes, and a descriptor at most the server's entries.

// maxAdminQuery bounds an admin call's query string.
const maxAdminQuery = 4096

// AdminToken is one credential of the admin API: Name says who holds it
// in the logs.
type AdminToken struct {
	Name, Token string
}

// adminCounter is the JSON of a look or a reset.
type adminCounter struct {
	Domain    string   `json:"domain"`
	Keys      []string `json:"keys"`
	Rule      string   `json:"rule,omitempty"`
	Kind      string   `json:"kind,omitempty"` // rate, concurrency, unlimited
	Limit     string   `json:"limit,omitempty"`
	Arm       string   `json:"arm,omitempty"`
	Remaining *int64   `json:"remaining,omitempty"`
	ResetIn   *float64 `json:"reset_in_seconds,omitempty"`
	Penalty   *float64 `json:"penalty_ends_in_seconds,omitempty"`
	// Limits are the limits of a rule of several (rate_limits), in its
	// order, each where it stands, instead of Limit, Remaining and
	// ResetIn.
	Limits []adminLimit `json:"limits,omitempty"`
	Reset  bool         `json:"reset,omitempty"`
	Note   string       `json:"note,omitempty"`
}

// adminLimit is one limit of a set in a look or a reset.
type adminLimit struct {
	Name      string   `json:"name"` // its statistics name (config.SetLimit.ID)
	Limit     string   `json:"limit"`
	Remaining *int64   `json:"remaining,omitempty"`
	ResetIn   *float64 `json:"reset_in_seconds,omitempty"`
}

// AdminHandler returns the admin API, authenticated by tokens (at least
// one, each of at least 16 bytes). Serve it on a listener of its own,
// never on the one gateways reach.
func (s *Server) AdminHandler(tokens []AdminToken) (http.Handler, error) {
	if len(tokens) == 0 {
		return nil, errors.New("server: the admin API needs a token")
	}
	for _, t := range tokens {
		if len(t.Token) < 16 {
			return nil, fmt.Errorf("server: admin token %q: at least 16 bytes", t.Name)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/counter", s.adminCall(tokens, false))
	mux.HandleFunc("POST /v1/counter/reset", s.adminCall(tokens, true))
	return mux, nil
}

func (s *Server) adminCall(tokens []AdminToken, reset bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		who := adminWho(tokens, r.Header.Get("Authorization"))
		if who == "" {
			s.log.Warn("admin: refused a call without a valid token", "remote", r.RemoteAddr, "path", r.URL.Path)
			w.Header().Set("WWW-Authenticate", `Bearer realm="tollgate admin"`)
			http.Error(w, "a valid bearer token is needed", http.StatusUnauthorized)
			return
		}
		domain, entries, err := s.adminDescriptor(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		out, status := s.adminCounter(r.Context(), who, domain, entries, reset)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(out) // an error is the client's connection
	}
}

// adminWho returns the name of the token auth carries, or "".
func adminWho(tokens []AdminToken, auth string) string {
	got, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok {
		return ""
	}
	who := ""
	for _, t := range tokens { // all of them, so the time says nothing
		if subtle.ConstantTimeCompare([]byte(got), []byte(t.Token)) == 1 {
			who = t.Name
		}
	}
	return who
}

// adminDescriptor reads a call's domain and entries, within bounds.
func (s *Server) adminDescriptor(r *http.Request) (string, []*rlv3.RateLimitDescriptor_Entry, error) {
	if len(r.URL.RawQuery) > maxAdminQuery {
		return "", nil, fmt.Errorf("the query is over %d bytes", maxAdminQuery)
	}
	q := r.URL.Query()
	domain := q.Get("domain")
	if domain == "" {
		return "", nil, errors.New("domain=NAME is needed")
	}
	raw := q["entry"]
	if len(raw) == 0 || len(raw) > s.max.entries {
		return "", nil, fmt.Errorf("1 to %d entry=KEY=VALUE are needed, got %d", s.max.entries, len(raw))
	}
	entries := make([]*rlv3.RateLimitDescriptor_Entry, len(raw))
	for i, e := range raw {
		k, v, _ := strings.Cut(e, "=")
		if k == "" {
			return "", nil, fmt.Errorf("entry %d: want KEY=VALUE", i+1)
		}
		entries[i] = &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v}
	}
	return domain, entries, nil
}

// adminCounter looks at (or resets) the counter of domain's descriptor of
// entries, on behalf of who.
func (s *Server) adminCounter(ctx context.Context, who, domain string, entries []*rlv3.RateLimitDescriptor_Entry, reset bool) (adminCounter, int) {
	out := adminCounter{Domain: domain}
	for _, e := range entries {
		out.Keys = append(out.Keys, e.GetKey())
	}
	rules := s.Rules()
	var r *config.Rule
	if rules != nil && rules.HasDomain(domain) {
		r = config.Lookup(rules, domain, entries)
	}
	if r == nil {
		out.Note = "no rule limits this descriptor"
		return out, http.StatusNotFound
	}
	out.Rule, out.Kind = r.ID, "rate"
	switch {
	case r.Unlimited:
		out.Kind, out.Note = "unlimited", "an unlimited rule keeps no counter"
		return out, http.StatusOK
	case r.Concurrency != nil:
		out.Kind, out.Note = "concurrency", "the slots of a concurrency rule cannot be looked at or reset here; they free themselves when their lease ends"
		return out, http.StatusOK
	case r.DenyAll():
		out.Note = "a rule of 0 requests per unit denies every request and keeps no counter"
		return out, http.StatusOK
	}
	key := counterKey(domain, entries, r)
	if r.Set != nil {
		return s.adminSet(ctx, who, r, key, reset, &out)
	}
	limit := r.Limit
	if ro := r.Rollout; ro != nil {
		arm := rollout.Of(ro, key, s.now())
		out.Arm = armLabels[arm]
		if arm == rollout.Rolled {
			limit = r.Rolled.Limit
		}
	}
	out.Limit = limit.String()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if reset {
		return s.adminReset(ctx, who, r, key, &out)
	}
	res, err := s.store.AllowN(ctx, key, limit, 0)
	if err != nil {
		out.Note = "the store failed: " + err.Error()
		return out, http.StatusServiceUnavailable
	}
	rem, in := int64(res.Remaining), res.ResetAfter.Seconds()
	out.Remaining, out.ResetIn = &rem, &in
	if r.Penalty != nil {
		q := s.engine.Begin(ctx)
		defer q.End()
		p := engine.Point{Rule: r.ID}
		if st, out2 := q.Penalized(&p, "", key, limit, r.Penalty); out2 && st.Err == nil {
			ends := st.Result.RetryAfter.Seconds()
			out.Penalty = &ends
		}
	}
	return out, http.StatusOK
}

// adminSet looks at (or resets) the counter of r, a rule of several
// limits, at key: each limit's state, and the penalty's.
func (s *Server) adminSet(ctx context.Context, who string, r *config.Rule, key string, reset bool, out *adminCounter) (adminCounter, int) {
	for i := range r.Set {
		out.Limits = append(out.Limits, adminLimit{Name: r.Set[i].ID, Limit: r.Set[i].Limit.String()})
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if reset {
		return s.adminReset(ctx, who, r, key, out)
	}
	for i, l := range r.SetLimits() {
		res, err := s.store.AllowN(ctx, key, l, 0)
		if err != nil {
			out.Note = "the store failed: " + err.Error()
			return *out, http.StatusServiceUnavailable
		}
		rem, in := int64(res.Remaining), res.ResetAfter.Seconds()
		out.Limits[i].Remaining, out.Limits[i].ResetIn = &rem, &in
	}
	if r.Penalty != nil {
		q := s.engine.Begin(ctx)
		defer q.End()
		p := engine.Point{Rule: r.ID}
		if st, on := q.Penalized(&p, "", key, r.SetLimits()[r.PenaltyLimit], r.Penalty); on && st.Err == nil {
			ends := st.Result.RetryAfter.Seconds()
			out.Penalty = &ends
		}
	}
	return *out, http.StatusOK
}

// adminReset deletes the counter of rule r at key (under every limit of a
// set), and the states beside it, and logs who did.
func (s *Server) adminReset(ctx context.Context, who string, r *config.Rule, key string, out *adminCounter) (adminCounter, int) {
	var err error
	if r.Set == nil {
		err = s.store.Reset(ctx, key, r.Limit)
	}
	for _, l := range r.SetLimits() {
		if err == nil {
			err = s.store.Reset(ctx, key, l)
		}
	}
	if err == nil && r.Rolled != nil {
		err = s.store.Reset(ctx, key, r.Rolled.Limit)
		if err == nil {
			err = s.store.Reset(ctx, storekey.Shadow(key), r.Rollout.Limit)
		}
	}
	if err == nil && r.Penalty != nil {
		err = s.resetPenalty(ctx, key, r)
	}
	sum := sha256.Sum256([]byte(key))
	attrs := []any{"admin", who, "domain", clip(r.Domain), "rule", r.ID, "keys", strings.Join(out.Keys, ","), "counter_sha256", hex.EncodeToString(sum[:8])}
	if err != nil {
		s.log.Error("admin: counter not reset", append(attrs, slog.String("error", err.Error()))...)
		out.Note = "the store failed: " + err.Error()
		return *out, http.StatusServiceUnavailable
	}
	s.log.Info("admin: counter reset", attrs...)
	out.Reset = true
	return *out, http.StatusOK
}

// resetPenalty deletes the penalty and the denials of r at key.
func (s *Server) resetPenalty(ctx context.Context, key string, r *config.Rule) error {
	pen, den := engine.PenaltyLimits(r.Penalty)
	if err := s.store.Reset(ctx, storekey.Penalty(key), pen); err != nil {
		return err
	}
	if den.Rate > 0 {
		return s.store.Reset(ctx, storekey.Denials(key), den)
	}
	return nil
}
