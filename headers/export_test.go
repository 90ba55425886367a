package headers

import "github.com/tollgate/tollgate/internal/headerfmt"

// Quota and Seconds are what the fields are made with, for the external
// tests.
var (
	Quota   = headerfmt.Quota
	Seconds = headerfmt.Seconds
)
