package memorystore

import (
	"time"

	"github.com/tollgate/tollgate"
)

// TTL reports how long key's state is kept, measured on the store's time
// (the latest reading of its clock), as a Redis PTTL.
func (s *Store) TTL(key string, limit tollgate.Limit) (time.Duration, bool) {
	exp, ok := s.expiry(key, limit)
	if !ok {
		return 0, false
	}
	return exp.Sub(time.UnixMicro(s.storeTime(s.clock()))), true
}
