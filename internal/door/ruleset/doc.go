// Package ruleset is the rule machinery the middleware shares: Rules holds
// options, rule checks, keys and the decision loop of httplimit and
// grpclimit, and Slots their concurrency limits. It spends through the
// per-call step of internal/door/engine (deadline, failure mode, dry run,
// store metrics, sampled failure logs), as the decision service does.
//
// It knows nothing of HTTP or gRPC: httplimit and grpclimit each say which
// requests a rule matches (patterns, methods), where key values come from
// (headers, metadata, the peer) and how a rejection is written (429 with a
// problem body, RESOURCE_EXHAUSTED with RetryInfo); the rest is Rules,
// generic over the transport's request type. The model is described in
// package enforce, which holds the vocabulary users see (Policy,
// FailureMode).
package ruleset
