package engine

import "fmt"

// Outcome is what a rule did with a request, as counted in metrics.
type Outcome uint8

const (
	// Allowed: every policy admitted the request.
	Allowed Outcome = iota
	// Denied: a policy denied it (or it costs more than a policy can ever
	// admit).
	Denied
	// DryRunDenied: a dry-run rule would have denied it; it went through.
	DryRunDenied
	// FailedOpen: the store failed and the rule let the request through.
	FailedOpen
	// FailedClosed: the store failed and the rule rejected the request.
	FailedClosed

	// NumOutcomes is how many outcomes a decision of the middleware's
	// rules can have: the five above, each a series of their metrics.
	NumOutcomes
)

// The decision service's descriptors end in three more ways, none of them
// a decision the middleware makes. They come after NumOutcomes so that the
// middleware's metrics keep their five series per rule.
const (
	// Unlimited: the rule sets no limit; the store was not asked.
	Unlimited Outcome = NumOutcomes + iota
	// Charged: a stream-done call charged its hits to the counter.
	Charged
	// Released: a stream-done call gave a concurrency slot back.
	Released
)

var outcomeNames = [...]string{"allowed", "denied", "dry_run_denied", "fail_open", "fail_closed", "unlimited", "charged", "released"}

// String returns the outcome's metric label: "allowed", "denied",
// "dry_run_denied", "fail_open" or "fail_closed" (and "unlimited",
// "charged" or "released").
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Blocks reports whether the request must be rejected.
func (o Outcome) Blocks() bool { return o == Denied || o == FailedClosed }
