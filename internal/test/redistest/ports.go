package redistest

import (
	"errors"
	"fmt"
	"net"
	"sync"
)

// Ports handed to live servers of this test binary. The kernel may return a
// port from net.Listen(":0") again as soon as it is closed, so without this
// two parallel tests could pick the same one.
var (
	portsMu  sync.Mutex
	reserved = map[int]bool{}
)

// pickFreePort is freePort; tests replace it to simulate a lost race for a port.
var pickFreePort = freePort

func (s *Server) pickPorts() error {
	p, err := pickFreePort()
	if err != nil {
		return err
	}
	s.port = p
	if s.cfg.cluster {
		// Redis 7's --cluster-port frees us from needing port+10000.
		if s.busPort, err = pickFreePort(); err != nil {
			return err
		}
	}
	return nil
}

func (s *Server) releasePorts() {
	portsMu.Lock()
	defer portsMu.Unlock()
	delete(reserved, s.port)
	delete(reserved, s.busPort)
}

func freePort() (int, error) {
	for range 50 {
		l, err := net.Listen("tcp", net.JoinHostPort(loopback, "0"))
		if err != nil {
			return 0, fmt.Errorf("redistest: start redis-server: pick a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		portsMu.Lock()
		taken := reserved[port]
		if !taken {
			reserved[port] = true
		}
		portsMu.Unlock()
		if !taken {
			return port, nil
		}
	}
	return 0, errors.New("redistest: start redis-server: no free port found")
}
