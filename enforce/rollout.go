package enforce

import (
	"errors"
	"fmt"
	"time"

	"github.com/tollgate/tollgate"
)

// Rollout brings a new limit in for a policy in steps that an operator
// controls: for a share of the keys first (a canary), from a set instant
// (announced until then), optionally tried in shadow by the keys it does
// not yet apply to.
//
// A key is in the rollout when its share, a stable hash of the key (see
// Share), is below Percent: the same key is in or out on every replica and
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
	// at most 100.
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

// Share returns where key falls in [0, 100): the 64-bit FNV-1a hash of the
// key, mixed by MurmurHash3's 64-bit finalizer (FNV-1a alone leaves keys
// that differ only in their last bytes close together in the top bits),
// scaled. The hash is part of the contract: a key's share never changes
// between versions, so a rollout keeps its keys across upgrades.
func Share(key string) float64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= prime
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	// The top 53 bits, exactly representable, over 2^53.
	return float64(h>>11) / (1 << 53) * 100
}

// Covers reports whether the rollout's share includes key.
func (r *Rollout) Covers(key string) bool { return Share(key) < r.Percent }

// Arm says which limit a rollout gives a key at an instant.
type Arm uint8

const (
	// Base: the policy's own Limit, the rollout not (or no longer) in
	// force for the key.
	Base Arm = iota
	// Announced: the policy's own Limit, with the new one announced.
	Announced
	// Rolled: the rollout's Limit.
	Rolled
)

// Arm returns which limit applies to key at now: Rolled when key is in
// the share and now is within [From, Until); Announced when key is in the
// share and From is still to come; Base otherwise.
func (r *Rollout) Arm(key string, now time.Time) Arm {
	if !r.Covers(key) || (!r.Until.IsZero() && !now.Before(r.Until)) {
		return Base
	}
	if !r.From.IsZero() && now.Before(r.From) {
		return Announced
	}
	return Rolled
}

// Check reports whether the rollout can replace a policy's limit base:
// a valid Limit, Percent in (0, 100], Until after From, and a Limit that
// counts on the same state as base (the same algorithm), since a key
// switching limits keeps its state.
func (r *Rollout) Check(base tollgate.Limit) error {
	if err := r.Limit.Validate(); err != nil {
		return fmt.Errorf("rollout: %w", err)
	}
	if !(r.Percent > 0 && r.Percent <= 100) {
		return fmt.Errorf("rollout: percent %v: want above 0 and at most 100", r.Percent)
	}
	if !r.From.IsZero() && !r.Until.IsZero() && !r.Until.After(r.From) {
		return errors.New("rollout: until must come after from")
	}
	if r.Limit.Algorithm != base.Algorithm || r.Limit.Period != base.Period {
		return fmt.Errorf("rollout: the new limit is %s per %v and the policy's %s per %v: a rollout changes the rate or the burst, not the algorithm or the period, so that a key keeps its state across the switch",
			r.Limit.Algorithm, r.Limit.Period, base.Algorithm, base.Period)
	}
	return nil
}
