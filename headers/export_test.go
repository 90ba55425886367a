package headers

// Quota and Seconds are quota and seconds, for the external tests.
var (
	Quota   = quota
	Seconds = seconds
)
