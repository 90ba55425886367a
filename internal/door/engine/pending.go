package engine

import (
	"context"
	"sync"
)

// pending counts the settles running in the background, for Drain.
type pending struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n is 0; nil means closed
}

func (p *pending) add() {
	p.mu.Lock()
	if p.n == 0 {
		p.idle = make(chan struct{})
	}
	p.n++
	p.mu.Unlock()
}

func (p *pending) done() {
	p.mu.Lock()
	p.n--
	if p.n == 0 {
		close(p.idle)
	}
	p.mu.Unlock()
}

func (p *pending) wait(ctx context.Context) error {
	p.mu.Lock()
	idle := p.idle
	n := p.n
	p.mu.Unlock()
	if n == 0 {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
