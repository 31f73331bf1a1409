package lockdtest

import (
	"net/http"
	"sync"
)

// Pause is an http.RoundTripper that stands for a client process that
// pauses (a long GC, SIGSTOP, a VM migration): while paused, none of its
// requests leave, keepalives included, so the server expires its session
// after TTL + grace while the code that holds the lock may still believe
// it does. It is a fake of a pause inside one test process, where a real
// SIGSTOP would stop the test too. Use it with lockd.WithStream(false), so
// that every call is a request of its own:
//
//	p := lockdtest.NewPause(nil)
//	c, err := lockd.New(lockd.WithEndpoints(srv.URL()),
//		lockd.WithHTTPClient(&http.Client{Transport: p}), lockd.WithStream(false))
type Pause struct {
	base http.RoundTripper

	mu      sync.Mutex
	resumed chan struct{} // nil while running; closed by Resume
}

// NewPause returns a running Pause over base (http.DefaultTransport when
// nil).
func NewPause(base http.RoundTripper) *Pause {
	if base == nil {
		base = http.DefaultTransport
	}
	return &Pause{base: base}
}

// Pause holds every request made from now on until Resume (or until the
// request's context ends). Requests already sent go on.
func (p *Pause) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resumed == nil {
		p.resumed = make(chan struct{})
	}
}

// Resume lets held and new requests go.
func (p *Pause) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resumed != nil {
		close(p.resumed)
		p.resumed = nil
	}
}

// RoundTrip sends req once the client is not paused.
func (p *Pause) RoundTrip(req *http.Request) (*http.Response, error) {
	p.mu.Lock()
	wait := p.resumed
	p.mu.Unlock()
	if wait != nil {
		select {
		case <-wait:
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	}
	return p.base.RoundTrip(req)
}

// CloseIdleConnections closes the base transport's idle connections.
func (p *Pause) CloseIdleConnections() {
	if c, ok := p.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}
