// Package engine is the per-call step behind every door: httplimit's and
// grpclimit's rules (internal/door/ruleset) and the decision service
// (internal/service) spend a limit for a key through an Engine, and nothing
// else calls the store to decide. Around each store call it puts what a
// decision needs wherever it comes from: a deadline shared by the calls
// that start at about the same time (Deadlines), the rule's failure mode
// when the store fails or the deadline passes, dry run, the store's
// latency and errors in the caller's metrics (Point), and failure logs
// sampled to one record per interval (Sampler) that says how many were
// left out (SkippedKey).
//
// It knows nothing of rules, keys or transports: which requests a rule
// matches, whom it counts them against and how a rejection is written are
// the ruleset's and the doors' business. Its vocabulary — FailureMode and
// the default timeout and log interval — is the public package enforce.
package engine
