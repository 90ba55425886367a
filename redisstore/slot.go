package redisstore

import "strings"

// crcTable is CRC-16/XMODEM (polynomial 0x1021, initial value 0) a byte at
// a time: the checksum Redis Cluster maps keys to slots with.
var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

// slot returns the Redis Cluster hash slot of key, as the cluster computes
// it: of the text between the first '{' and the first '}' after it when
// that is not empty, else of the whole key.
func slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var c uint16
	for i := 0; i < len(key); i++ {
		c = c<<8 ^ crcTable[byte(c>>8)^key[i]]
	}
	return int(c & 16383)
}
