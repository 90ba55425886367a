package model

// logState is a sliding window log: the times of every admitted request
// that can still count, oldest first, as runs of equal times.
type logState struct {
	runs []run
}

type run struct{ at, count int64 }

func (*logState) isState() {}

func asLog(s state) *logState {
	g, _ := s.(*logState)
	return g
}

// slidingWindowLog admits a request of cost n (n entries) if the entries in
// the span of Period ending at the key's time, plus n, are at most Rate.
// The key's time is now, or its newest entry's time if the clock stepped
// back behind it: the key's time never goes back, so no span of Period ever
// holds more than Rate entries.
func slidingWindowLog(s *logState, l lim, now, n int64) (outcome, state) {
	var runs []run
	if s != nil {
		runs = s.runs
	}
	at := now
	if len(runs) > 0 {
		at = max(at, runs[len(runs)-1].at)
	}
	// The entries in (at − Period, at], oldest first.
	first := 0
	for first < len(runs) && runs[first].at <= at-l.period {
		first++
	}
	live := runs[first:]
	var count int64
	for _, r := range live {
		count = add(count, r.count)
	}
	var o outcome
	var next state
	switch {
	case n == 0:
		o.allowed = true
	case add(count, n) <= l.rate:
		o.allowed = true
		count += n
		// Entries older than the span can never count again: the key's
		// time never goes back.
		kept := make([]run, 0, len(live)+1)
		kept = append(kept, live...)
		if len(kept) > 0 && kept[len(kept)-1].at == at {
			kept[len(kept)-1].count += n
		} else {
			kept = append(kept, run{at, n})
		}
		live = kept
		next = &logState{runs: kept}
	default:
		// The oldest count+n−Rate entries must leave the span: the last of
		// them leaves at its time + Period.
		must := count + n - l.rate
		for _, r := range live {
			if must <= r.count {
				o.retry = r.at + l.period - now
				break
			}
			must -= r.count
		}
	}
	o.remaining = max(l.rate-count, 0)
	if count > 0 {
		o.reset = live[len(live)-1].at + l.period - now
	}
	return o, next
}
