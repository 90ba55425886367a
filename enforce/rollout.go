package enforce

import (
	"time"

	"github.com/tollgate/tollgate"
)

// Rollout brings a new limit in for a policy in steps that an operator
// controls: for a share of the keys first (a canary), from a set instant
// (announced until then), optionally tried in shadow by the keys it does
// not yet apply to.
//
// A key is in the rollout when its share, a stable hash of the key (64-bit
// FNV-1a, then MurmurHash3's finalizer, scaled to [0, 100)), is below
// Percent: the same key is in or out on every replica and
// every restart, and raising Percent only adds keys, so a client never
// flips back and forth between the limits while a rollout widens. Lowering
// it takes keys out again, which is how a rollout is undone.
//
// Both limits count on the key's one state, so a key that enters the
// rollout keeps what it has spent: it does not start afresh under the new
// limit. A shadow evaluation is made on a state of its own, so that trying
// the new limit never spends from the one in force.
type Rollout struct {
	// Limit is the new limit.
	Limit tollgate.Limit
	// Percent is the share of keys the new limit applies to, above 0 and
	// at most 100. The new limit keeps the policy's algorithm and period,
	// so that a key switching limits keeps its state; a door refuses a
	// rollout that changes either, or whose Until is not after From.
	Percent float64
	// From, when not zero, is when the new limit starts applying. Until
	// then a door announces it (RateLimit-Policy lists it with the
	// parameter tollgate-from) to the keys it will apply to, so that
	// clients learn of a tighter limit before it bites.
	From time.Time
	// Until, when not zero, is when the new limit stops applying and the
	// policy's own Limit is back: a temporary change.
	Until time.Time
	// Shadow makes the keys the new limit does not apply to (outside
	// Percent, or before From) try it too: it decides on a state of its
	// own, is counted, and never blocks. Its would-be denials are the 429s
	// the new limit would add.
	Shadow bool
}
