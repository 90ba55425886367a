package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/internal/door/storekey"
)

// A policy's penalty (enforce.Penalty) is two states beside the policy's,
// under keys of their own (storekey.Penalty, storekey.Denials):
//
//   - the penalty: a token bucket of one per For, burst 1. Starting a
//     penalty spends its token; while it runs, a look (cost 0) finds no
//     token, and its ResetAfter is when the penalty ends. Starting one
//     while one runs finds no token and changes nothing.
//   - the denials: a sliding log of After-1 per Within. Each denial of the
//     policy spends one; the one it refuses is the After-th, which starts
//     the penalty.

// CheckPenalty reports whether pen can be used: For a valid period of a
// limit, After not negative, and Within given when After counts more than
// one denial.
func CheckPenalty(pen *enforce.Penalty) error {
	if pen.For <= 0 {
		return errors.New("penalty: for must be positive")
	}
	if err := penaltyLimit(pen).Validate(); err != nil {
		return fmt.Errorf("penalty: for %v: %w", pen.For, err)
	}
	if pen.After < 0 {
		return fmt.Errorf("penalty: after %d: want 0 or more", pen.After)
	}
	if pen.After > 1 {
		if pen.Within <= 0 {
			return fmt.Errorf("penalty: after %d denials needs within, the window they are counted in", pen.After)
		}
		if err := denialsLimit(pen).Validate(); err != nil {
			return fmt.Errorf("penalty: %d denials within %v: %w", pen.After, pen.Within, err)
		}
	}
	return nil
}

func penaltyLimit(pen *enforce.Penalty) tollgate.Limit {
	return tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 1, Period: pen.For, Burst: 1}
}

func denialsLimit(pen *enforce.Penalty) tollgate.Limit {
	return tollgate.Limit{Algorithm: tollgate.SlidingWindowLog, Rate: pen.After - 1, Period: pen.Within}
}

// Penalized looks at the penalty of key under policy l, on behalf of the
// rule at p. When one runs it returns a denial until its end (Result's
// Limit l, nothing spent) and true; when the store fails, that failure's
// Step and true; otherwise false, and the policy decides.
func (q *Request) Penalized(p *Point, policy, key string, l tollgate.Limit, pen *enforce.Penalty) (Step, bool) {
	st := q.Spend(p, policy, storekey.Penalty(key), penaltyLimit(pen), 0)
	switch {
	case st.Outcome == FailedOpen || st.Outcome == FailedClosed:
		st.Result.Limit = l
		return st, true
	case st.Result.Remaining > 0:
		return Step{}, false
	}
	wait := st.Result.ResetAfter
	return Step{Outcome: deny(p), Result: tollgate.Result{Limit: l, RetryAfter: wait, ResetAfter: wait}}, true
}

// Trip records a denial of key by its policy, on behalf of the rule at p,
// and reports whether it started the penalty: then the denial's wait is at
// least the penalty's. A store failure here starts nothing: the denial
// stands as it is.
func (q *Request) Trip(p *Point, policy, key string, pen *enforce.Penalty) (started bool, wait time.Duration) {
	if pen.After > 1 {
		if st := q.Spend(p, policy, storekey.Denials(key), denialsLimit(pen), 1); st.Outcome != Denied && st.Outcome != DryRunDenied {
			return false, 0
		}
	}
	st := q.Spend(p, policy, storekey.Penalty(key), penaltyLimit(pen), 1)
	if st.Outcome != Allowed {
		return false, 0
	}
	return true, pen.For
}

// PenaltyLimits returns the limits of pen's two states: the penalty's, and
// the denials' (its Rate 0 when the first denial starts the penalty and no
// denials are counted), for whoever resets them.
func PenaltyLimits(pen *enforce.Penalty) (penalty, denials tollgate.Limit) {
	if pen.After > 1 {
		denials = denialsLimit(pen)
	}
	return penaltyLimit(pen), denials
}
