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

	NumOutcomes
)

var outcomeNames = [NumOutcomes]string{"allowed", "denied", "dry_run_denied", "fail_open", "fail_closed"}

// String returns the outcome's metric label: "allowed", "denied",
// "dry_run_denied", "fail_open" or "fail_closed".
func (o Outcome) String() string {
	if o < NumOutcomes {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Blocks reports whether the request must be rejected.
func (o Outcome) Blocks() bool { return o == Denied || o == FailedClosed }
