package redisstore

// ParseInts is parseInts, for the reply checks' tests.
var ParseInts = parseInts
