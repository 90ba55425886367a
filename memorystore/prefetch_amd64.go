package memorystore

// prefetch asks the CPU to bring the cache line at addr into its caches. It
// is a hint: it never faults, whatever addr is, and changes no memory.
//
//go:noescape
func prefetch(addr uintptr)
