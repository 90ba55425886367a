package httplimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/tollgate/tollgate/internal/door/ruleset"
)

// Settle makes a Rule's Cost an estimate, corrected once the response is
// done: for APIs billed in what a request turns out to use (the tokens of
// an LLM completion, bytes, rows), and for teams whose failed requests (a
// 5xx the client did not cause) should not count. The rule reserves the
// estimate before the handler runs, exactly as it would spend it (a
// request the estimate does not fit is denied); after the handler returns,
// each policy that admitted the request is settled to the real cost: a
// refund when it cost less, an extra charge when it cost more (which the
// key's next requests wait out), nothing when it cost the estimate. What
// each algorithm can settle is described at tollgate.Settler.
//
// The real cost is, in this order: 0 when Refund says so of the status;
// what Func returns; or the number in the Header the handler set. Without
// one of them (a response without the header, Func returning false) the
// estimate stands.
//
// The store must be a tollgate.Settler (memorystore and redisstore are):
// New refuses the rule otherwise. A settle is a store call made after the
// response, in the background, so that the client never waits for it: it
// is bounded by enforce.WithTimeout like every store call, on a context the end of
// the request does not cancel, and when the store fails or misses the
// deadline it is counted in tollgate_http_store_errors_total and logged,
// sampled, and the estimate stands. A request the Limiter turns away (by
// any rule) was not served: its reservations are refunded. A handler that
// panics leaves the estimate standing. Limiter.Drain waits for the settles
// in flight, for a graceful shutdown.
//
// The rate-limit headers of the response describe the reservation: they
// are written before the body, when only the estimate is known.
type Settle struct {
	// Header names the response header in which the handler reports the
	// real cost, such as "X-Tokens-Used": set before the body is written,
	// or as a trailer (announced in the Trailer header, or set after the
	// body under http.TrailerPrefix + Header); a trailer wins over a
	// header. Its value must be one decimal number from 0 to 2^53 − 1,
	// spaces around it allowed: anything else (several values, a sign, not
	// a number, more) is never trusted: the estimate stands, and it is
	// counted in tollgate_http_bad_costs_total and logged without the
	// value. A number that is too large for a policy is bounded by the
	// store (tollgate.CheckSettle): one settle charges at most the policy's
	// Capacity plus its MaxDebt beyond the estimate.
	Header string
	// Func, if set instead of Header, says the real cost from the
	// response's status and header, which holds the trailers the handler
	// set (under their names when announced, otherwise under
	// http.TrailerPrefix + name); false leaves the estimate standing. A
	// negative cost is counted and logged as Header's bad values are.
	Func func(status int, header http.Header) (cost int, ok bool)
	// Refund, if set, refunds the whole estimate of a response whose
	// status it returns true for: ServerError refunds every 5xx.
	Refund func(status int) bool
	// Hide removes Header from the response the client gets: it is an
	// internal signal between the handler and the limiter. An announced
	// trailer is removed from the Trailer header too.
	Hide bool
}

// ServerError reports whether status is a 5xx, a failure of the server
// rather than the client: a Settle.Refund for APIs that do not charge for
// their own errors.
func ServerError(status int) bool { return status >= 500 && status <= 599 }

// settler is one Rule's Settle, checked.
type settler struct {
	header string // canonical; "" with Func
	func_  func(int, http.Header) (int, bool)
	refund func(int) bool
	hide   bool
}

func newSettler(rule string, s *Settle) (*settler, error) {
	switch {
	case s.Header == "" && s.Func == nil && s.Refund == nil:
		return nil, fmt.Errorf("httplimit: rule %q: Settle needs a Header, a Func or a Refund", rule)
	case s.Header != "" && s.Func != nil:
		return nil, fmt.Errorf("httplimit: rule %q: Settle takes a Header or a Func, not both", rule)
	case s.Hide && s.Header == "":
		return nil, fmt.Errorf("httplimit: rule %q: Settle.Hide hides Header, which is not set", rule)
	case s.Header != "" && !validHeaderName(s.Header):
		return nil, fmt.Errorf("httplimit: rule %q: Settle.Header %q is not a header name", rule, s.Header)
	}
	return &settler{header: http.CanonicalHeaderKey(s.Header), func_: s.Func, refund: s.Refund, hide: s.Hide}, nil
}

func validHeaderName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return s != ""
}

// Why a value of Settle.Header is refused, for logs; never the value.
var errBadHeader = errors.New("httplimit: the real cost header")

// actual is the real cost of the response m recorded under s.
func (s *settler) actual(m *meter) (int, bool, error) {
	if s.refund != nil && s.refund(m.status) {
		return 0, true, nil
	}
	if s.func_ != nil {
		n, ok := s.func_(m.status, m.Header())
		return n, ok, nil
	}
	if s.header == "" {
		return 0, false, nil
	}
	n, ok, err := ruleset.ParseCost(m.values(s.header))
	if err != nil {
		return 0, false, fmt.Errorf("%w %s: %w", errBadHeader, s.header, err)
	}
	return n, ok, nil
}

// meter is the ResponseWriter of a request whose rules settle: it records
// the status and takes the hidden headers out of the response.
type meter struct {
	http.ResponseWriter
	hide    []string            // canonical names to keep from the client
	status  int                 // the final status, once written
	removed map[string][]string // hidden headers as they were when the header was written
}

// WriteHeader records the final status (not a 1xx, but 101), having taken
// the hidden headers out. An informational response (103 Early Hints)
// sends the header as it is then: the hidden headers are kept out of it
// too, and put back for the final one.
func (m *meter) WriteHeader(code int) {
	if m.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		m.written(code)
	} else if m.status == 0 && len(m.hide) > 0 {
		h := m.ResponseWriter.Header()
		kept := make(map[string][]string, len(m.hide))
		for _, name := range m.hide {
			if vs, ok := h[name]; ok {
				kept[name] = vs
				delete(h, name)
			}
		}
		m.ResponseWriter.WriteHeader(code)
		for name, vs := range kept {
			h[name] = vs
		}
		return
	}
	m.ResponseWriter.WriteHeader(code)
}

func (m *meter) Write(b []byte) (int, error) {
	if m.status == 0 {
		m.written(http.StatusOK)
	}
	return m.ResponseWriter.Write(b)
}

// Flush sends what was written so far, as http.Flusher: streaming handlers
// (server-sent events) need it.
func (m *meter) Flush() {
	if m.status == 0 {
		m.written(http.StatusOK)
	}
	_ = http.NewResponseController(m.ResponseWriter).Flush()
}

// ReadFrom writes r's bytes as the body through the writer underneath's
// own ReadFrom when it has one, as io.Copy would without the meter:
// net/http's sends a file with sendfile.
func (m *meter) ReadFrom(r io.Reader) (int64, error) {
	if m.status == 0 {
		m.written(http.StatusOK)
	}
	if rf, ok := m.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{m.ResponseWriter}, r)
}

// Unwrap gives http.ResponseController the writer underneath.
func (m *meter) Unwrap() http.ResponseWriter { return m.ResponseWriter }

// written records status as the response's, at the moment its header is
// sent: the hidden headers are taken out of it, and out of the trailers it
// announces.
func (m *meter) written(status int) {
	m.status = status
	if len(m.hide) == 0 {
		return
	}
	h := m.ResponseWriter.Header()
	for _, name := range m.hide {
		if vs, ok := h[name]; ok {
			if m.removed == nil {
				m.removed = map[string][]string{}
			}
			m.removed[name] = vs
			delete(h, name)
		}
	}
	if tr, ok := h["Trailer"]; ok {
		h["Trailer"] = unannounce(tr, m.hide)
		if len(h["Trailer"]) == 0 {
			delete(h, "Trailer")
		}
	}
}

// unannounce returns the Trailer header values tr without the names in
// hide.
func unannounce(tr, hide []string) []string {
	var out []string
	for _, v := range tr {
		var keep []string
		for _, name := range strings.Split(v, ",") {
			name = strings.TrimSpace(name)
			if name != "" && !slices.Contains(hide, http.CanonicalHeaderKey(name)) {
				keep = append(keep, name)
			}
		}
		if len(keep) > 0 {
			out = append(out, strings.Join(keep, ", "))
		}
	}
	return out
}

// done is called when the handler has returned, before net/http writes the
// trailers: a response that wrote nothing is a 200, and the hidden headers
// set as trailers are taken out, kept for values.
func (m *meter) done() {
	if m.status == 0 {
		m.written(http.StatusOK)
	}
	h := m.ResponseWriter.Header()
	for _, name := range m.hide {
		for _, k := range []string{name, http.TrailerPrefix + name} {
			if vs, ok := h[k]; ok {
				if m.removed == nil {
					m.removed = map[string][]string{}
				}
				m.removed[k] = vs
				delete(h, k)
			}
		}
	}
}

// values returns what the response reported under name: its trailer if it
// set one, else its header.
func (m *meter) values(name string) []string {
	h := m.ResponseWriter.Header()
	if vs, ok := m.removed[http.TrailerPrefix+name]; ok {
		return vs
	}
	if vs, ok := h[http.TrailerPrefix+name]; ok {
		return vs
	}
	if vs, ok := h[name]; ok {
		return vs
	}
	return m.removed[name]
}

// serveSettled runs next for a request holding reservations, and settles
// them when it returns.
func (l *Limiter) serveSettled(w http.ResponseWriter, r *http.Request, next http.Handler, s *ruleset.Scratch) {
	m := &meter{ResponseWriter: w, hide: l.hide}
	next.ServeHTTP(m, r)
	m.done()
	l.rules.Settle(r.Context(), s, func(rule int) (int, bool, error) {
		if st := l.settlers[rule]; st != nil {
			return st.actual(m)
		}
		return 0, false, nil
	})
}

// Drain waits until the settles of the responses already written (see
// Settle) have reached the store or given up, or until ctx ends, and
// returns ctx's error then. Call it when shutting down, after
// http.Server.Shutdown, so that the last corrections are not lost.
func (l *Limiter) Drain(ctx context.Context) error {
	if l.rules == nil {
		return nil // a concurrency limit settles nothing
	}
	return l.rules.Drain(ctx)
}
