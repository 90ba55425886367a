//go:build !linux

package memorystore

// adviseHugePages does nothing here: the block is in base pages.
func adviseHugePages([]entry) {}
