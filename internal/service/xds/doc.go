// Package xds takes tollgate serve's rules from an xDS management server,
// as envoyproxy/ratelimit does with CONFIG_TYPE=GRPC_XDS_SOTW: Envoy
// Gateway pushes its rate limits that way.
//
// # The model
//
// A Client opens one gRPC stream of the Aggregated Discovery Service to
// the server, names its node (id and metadata), and asks for every
// resource of type RateLimitConfig (TypeURL), one per domain, named by the
// domain; a domain's name may hold '/' (Envoy Gateway's are
// namespace/gateway/listener). The protocol is the State of the World:
// each response holds every domain, so a domain left out is deleted, and
// requests in it are answered OK with no limit, as for any unknown
// domain.
//
// Each response is loaded whatever its version says (a management
// server numbers its versions from "1" again when it restarts), through
// the loader of rules files: every resource is rendered as the rules
// file that says the same (render.go) and config.ParseSources reads them
// under the limits of a directory of files, so that a pushed config meets
// every check and bound a file meets. Loaded rules go into force through
// the Updater (*service.Server), counted and logged as a file reload is,
// and the response is ACKed; refused ones are NACKed with the loader's
// message, and the rules in force stay.
//
// go-control-plane answers a NACK by sending the same snapshot again at
// once, for as long as it stays: the Client refuses such a resend without
// loading it again, after a pause of 100 ms, so that the two settle at
// about ten NACKs a second instead of spinning, and the Updater logs the
// same refusal at most once per log interval.
//
// When the connection or the stream fails, the rules in force stay, and
// the Client reconnects as Backoff says, with TLS files read again; a new
// stream asks from no version at all, so the server sends its whole state.
package xds
