//go:build !amd64

package memorystore

// prefetch does nothing here: a decision reads its entry when it gets to
// it.
func prefetch(addr uintptr) {}
