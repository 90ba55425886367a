// Package config reads the rate-limit rules that tollgate serve applies: the
// YAML format of envoyproxy/ratelimit, accepted as it is, plus tollgate's own
// keys beside it.
//
// # The model
//
// A file holds one domain (or several YAML documents, one domain each). A
// domain is a tree of descriptors; each node has a key, an optional value
// and optionally a rate_limit and nested descriptors:
//
//	domain: edge
//	descriptors:
//	  - key: remote_address            # any value: one counter per address
//	    rate_limit: {unit: second, requests_per_unit: 10}
//	  - key: remote_address            # this value only: blocked
//	    value: 50.0.0.5
//	    rate_limit: {unit: second, requests_per_unit: 0}
//
// A request names a domain and a descriptor: a list of (key, value) entries.
// Lookup walks the tree one entry per level. At each level an entry matches,
// in this order, a node with the same key and value, then a node with the
// same key whose value is a wildcard pattern ('*' matches any run of
// characters, anywhere in the value; patterns are tried in file order), then
// a node with the same key and no value. The rule that applies is the
// rate_limit of the node matched by the request's last entry: a request with
// more or fewer entries than the path to a rate_limit has no limit. An
// unknown domain, or an entry that matches nothing, has no limit either.
// These are envoyproxy/ratelimit's rules (config_impl.go), except that a
// wildcard pattern here is matched against the value only, never against the
// key and value joined by '_' (so key "a" with pattern "b*" cannot match key
// "a_bx").
//
// # Keys of a rate_limit
//
// From envoyproxy/ratelimit: unit (second, minute, hour, day, week, month
// = 30 days, year = 365 days; any case), requests_per_unit (0 denies every
// request), unlimited, name, replaces (a list of {name}); and beside the
// rate_limit, on the descriptor: shadow_mode, quota_mode, detailed_metric,
// value_to_metric, share_threshold and metadata (metadata.go: returned in
// the dynamic metadata of the answers the rule passes).
//
// tollgate's extensions, in rate_limit or as defaults at the top of a file:
//   - algorithm: one of tollgate's six (token_bucket, gcra, fixed_window,
//     sliding_window_log, sliding_window_counter, leaky_bucket). When no
//     rule and no file default names one, a rule is a fixed_window, which is
//     what envoyproxy/ratelimit counts with, so an envoy file keeps its
//     meaning unchanged.
//   - burst: the capacity of token_bucket, gcra and leaky_bucket (default:
//     requests_per_unit). Rejected on the window algorithms, which have none.
//   - failure_mode: open (answer OK) or closed (answer OVER_LIMIT) when the
//     store fails or misses its deadline. Default: the server's setting.
//   - cost: how much one hit spends (default 1); a request spends
//     hits_addend × cost.
//   - calendar: an IANA time zone (Europe/Berlin, UTC) whose calendar the
//     unit follows: day from local midnight to midnight, week from Monday,
//     month from the 1st (tollgate.Limit.Calendar), for fixed_window and
//     sliding_window_counter only. Without it a day is 24 hours, a week 7
//     days and a month 30 days from the Unix epoch, as in envoy.
//
// # Concurrency rules
//
// A descriptor may carry a concurrency limit instead of a rate_limit
// (tollgate's own key; a descriptor with both is an error):
//
//	descriptors:
//	- key: tenant
//	  concurrency:
//	    max_in_flight: 5     # 1 to 10,000 requests of one tenant at once
//	    lease: 5m            # a Go duration, 1ms to 24h
//	    name: per_tenant     # optional, as a rate_limit's
//	    failure_mode: closed # optional, as a rate_limit's
//
// It matches like any rule; what a server does with it — a slot taken when
// a request starts, given back when it ends or when its lease runs out —
// is the service's (see internal/service). Rules.Dump shows it as
// "domain.tenant: concurrency max_in_flight=5 lease=5m0s, ...".
//
// # Several limits on one descriptor
//
// A descriptor may carry rate_limits, a list of 2 to MaxSetLimits
// rate_limit mappings, instead of rate_limit (tollgate's own key): a plan
// such as 2 a second and 100 a day, which a request spends together, all
// or nothing.
//
//	descriptors:
//	- key: plan
//	  value: free
//	  rate_limits:
//	  - {unit: second, requests_per_unit: 2}
//	  - {unit: day, requests_per_unit: 100}
//
// Lookup returns one rule for the descriptor, its limits in Rule.Set.
// Each limit keeps unit, requests_per_unit, algorithm, burst, calendar and
// name; cost and failure_mode are the set's and must agree; one limit may
// carry the set's penalty; unlimited, requests_per_unit 0, rollout and
// replaces are refused, and so are two limits that would count into one
// state (the same algorithm and unit). set.go says why. Each limit is
// named for statistics after the descriptor's path and its name or unit
// ("api.plan_free.second", "api.plan_free.day"), and Rules.Dump shows a
// line for each.
//
// Anything else is an error naming the file, the line and the column, and
// so is every invalid value; Load returns every error of a file at once.
// WithWarnings reports, at their lines and columns too, the rules that load
// but are likely not what was meant: descriptors no request reaches, and
// rates suspicious for their unit (tollgate check prints them).
//
// # Files, domains and names as envoyproxy/ratelimit has them
//
// A domain is defined once, in one file, unless WithMergeDomains merges
// the top-level descriptors of every file of a domain (envoy's
// MERGE_DOMAIN_CONFIG). Load reads the *.yaml and *.yml files of a
// directory; WithRuntimeTree and WithDotFiles read the files envoy's
// runtime would (every file of the tree, dotfiles as RUNTIME_IGNOREDOTFILES
// says), and FromEnv turns envoy's environment into a path and those
// options. MetricID names a request's statistics as envoy names them, and
// Rules.Dump writes the rules as envoy's /rlconfig shows them.
// ParseSources reads rules that come as named contents rather than files
// (the resources an xDS management server pushes, rendered as rules
// files), each as a file and under the same limits.
//
// # Untrusted files
//
// Whoever can write the rules decides what a service loads, on every
// reload, so Load treats each file as untrusted input and bounds what it
// can cost (see Limits): the size and number of files, how deep
// descriptors nest, how many there are, how long a key or value is, and
// what a file becomes once its YAML aliases are expanded. Anchors and
// aliases are accepted, as envoyproxy/ratelimit accepts them, but each use
// of an alias counts as a copy of what it names, so a few hundred bytes of
// aliases of aliases, or an anchor used inside itself, is refused with the
// line of the alias instead of expanding into millions of rules. A file
// over a limit is an error like any other: a reload keeps the rules in
// force.
package config
