//go:build unix && !linux

package promtest

import "syscall"

// sysProcAttr puts Prometheus in its own process group; the test's cleanup
// kills it.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
