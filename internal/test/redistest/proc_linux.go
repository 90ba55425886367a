//go:build linux

package redistest

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// sysProcAttr puts redis-server in its own process group (so that signals
// reach any child it forks, e.g. for a replication RDB) and asks the kernel to
// SIGKILL it when its parent goes away.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Setpgid:   true,
		Pdeathsig: syscall.SIGKILL,
	}
}

// Pdeathsig fires when the *thread* that forked the child exits, not only when
// the whole process does (golang.org/issue/27505). The Go runtime terminates a
// thread when a goroutine that called runtime.LockOSThread returns without
// unlocking it, so a child forked from an arbitrary thread could be killed in
// the middle of a test. All processes are therefore forked from one goroutine
// that stays locked to its thread for the life of the test binary.
type spawnRequest struct {
	cmd  *exec.Cmd
	done chan error
}

var (
	spawnOnce sync.Once
	spawnCh   chan spawnRequest
)

func startProcess(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnCh = make(chan spawnRequest)
		go spawner()
	})
	req := spawnRequest{cmd: cmd, done: make(chan error, 1)}
	spawnCh <- req
	return <-req.done
}

// spawner forks every process; see spawnRequest.
func spawner() {
	runtime.LockOSThread() // never unlocked, see above
	for req := range spawnCh {
		req.done <- req.cmd.Start()
	}
}
