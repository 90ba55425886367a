// Package rollout decides, for every door, which limit a policy's rollout
// (enforce.Rollout) gives a key at an instant, and checks a rollout
// against the limit it replaces.
package rollout

import (
	"errors"
	"fmt"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
)

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

// Covers reports whether r's share includes key.
func Covers(r *enforce.Rollout, key string) bool { return Share(key) < r.Percent }

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

// Of returns which limit r gives key at now: Rolled when key is in the
// share and now is within [From, Until); Announced when key is in the
// share and From is still to come; Base otherwise.
func Of(r *enforce.Rollout, key string, now time.Time) Arm {
	if !Covers(r, key) || (!r.Until.IsZero() && !now.Before(r.Until)) {
		return Base
	}
	if !r.From.IsZero() && now.Before(r.From) {
		return Announced
	}
	return Rolled
}

// Check reports whether r can replace a policy's limit base:
// a valid Limit, Percent in (0, 100], Until after From, and a Limit that
// counts on the same state as base (the same algorithm), since a key
// switching limits keeps its state.
func Check(r *enforce.Rollout, base tollgate.Limit) error {
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
