package redisstore

import "time"

// SetEdgeClock makes s compute calendar windows' edges from now instead of
// the application's clock, while the scripts keep the server's.
func SetEdgeClock(s *Store, now func() time.Time) { s.edges = now }
