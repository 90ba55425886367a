package memorystore

import (
	"syscall"
	"unsafe"
)

// hugePage is the size of a transparent huge page on x86-64 and arm64
// (with 4 KiB base pages).
const hugePage = 2 << 20

// adviseHugePages asks Linux to back the whole huge pages inside block's
// memory with huge pages, before anything is written to it: a page faulted
// in afterwards is then a huge page where the system has one free. It is
// advice: where transparent huge pages are off, or the call fails, the
// block works as it is, in base pages.
func adviseHugePages(block []entry) {
	size := len(block) * int(unsafe.Sizeof(entry{}))
	if size < 2*hugePage {
		return
	}
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&block[0])), size)
	start := (hugePage - int(uintptr(unsafe.Pointer(&mem[0]))%hugePage)) % hugePage
	end := start + (size-start)/hugePage*hugePage
	_ = syscall.Madvise(mem[start:end], syscall.MADV_HUGEPAGE)
}
