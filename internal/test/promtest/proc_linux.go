//go:build linux

package promtest

import "syscall"

// sysProcAttr puts Prometheus in its own process group and asks the kernel
// to SIGKILL it when the test binary goes away, even killed by go test's
// timeout, so that it never outlives the test.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
