//go:build unix && !linux

package redistest

import (
	"os/exec"
	"syscall"
)

// sysProcAttr puts redis-server in its own process group. Pdeathsig only
// exists on Linux; elsewhere Close is the only thing that stops the process.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

func startProcess(cmd *exec.Cmd) error { return cmd.Start() }
