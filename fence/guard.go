package fence

import (
	"fmt"
	"sync"
)

// Guard remembers, per key, the highest token it has accepted, and
// refuses any lower one. A token equal to the highest is accepted: the
// same grant may act many times. It is safe for concurrent use; the zero
// value is ready. Keys are kept until Forget.
type Guard struct {
	mu   sync.Mutex
	keys map[string]*entry
}

// entry is one key: its own mutex serializes Do's check-and-act, so two
// keys never wait for each other.
type entry struct {
	mu      sync.Mutex
	highest uint64
}

func (g *Guard) entry(key string) *entry {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.keys == nil {
		g.keys = map[string]*entry{}
	}
	e := g.keys[key]
	if e == nil {
		e = &entry{}
		g.keys[key] = e
	}
	return e
}

// Admit accepts token for key if it is at least the highest accepted so
// far, and records it; otherwise it returns a *StaleError (matching
// ErrStale). Admit alone does not order what the caller does next: a
// newer holder may be admitted between this Admit and the caller's write.
// When the write is in this process, use Do.
func (g *Guard) Admit(key string, token uint64) error {
	if token == 0 {
		return fmt.Errorf("admit %q: %w", key, ErrNoToken)
	}
	e := g.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.admit(key, token)
}

func (e *entry) admit(key string, token uint64) error {
	if token < e.highest {
		return &StaleError{Key: key, Token: token, Highest: e.highest}
	}
	e.highest = token
	return nil
}

// Do admits token for key and, if admitted, runs f before any later
// holder of key is admitted: the check and the action are one step, so a
// stale holder's action can never land after a newer holder's. f's error
// is returned as is; the token stays admitted even when f fails (the
// holder may retry with it). f must not call the Guard for the same key.
func (g *Guard) Do(key string, token uint64, f func() error) error {
	if token == 0 {
		return fmt.Errorf("admit %q: %w", key, ErrNoToken)
	}
	e := g.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.admit(key, token); err != nil {
		return err
	}
	return f()
}

// Highest returns the highest token accepted for key, 0 for none.
func (g *Guard) Highest(key string) uint64 {
	e := g.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.highest
}

// Forget drops what the guard remembers of key, when the resource itself
// is gone. Never forget a key whose resource may still be written: a
// stale holder would be admitted again.
func (g *Guard) Forget(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.keys, key)
}
