package ruleset

import "strconv"

// appendPart finishes one part of a composite key: dst[start:] holds the
// part's value, just appended, and appendPart rewrites it as the value's
// length in decimal, ':', then the value. The length is never clamped, and
// the terminator ends it, so the encoding of a tuple of parts is
// unambiguous whatever the parts hold or how long they are: no two
// different tuples spell the same key. It moves the value in place, and
// allocates only when dst lacks room for the length.
func appendPart(dst []byte, start int) []byte {
	var digits [20]byte
	n := strconv.AppendInt(digits[:0], int64(len(dst)-start), 10)
	shift := len(n) + 1
	for range shift {
		dst = append(dst, 0)
	}
	copy(dst[start+shift:], dst[start:len(dst)-shift])
	copy(dst[start:], n)
	dst[start+len(n)] = ':'
	return dst
}
