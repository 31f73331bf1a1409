package fence

import (
	"errors"
	"fmt"
)

// ErrStale means a token is below the highest one the resource has
// accepted for its key: its holder lost the lock, and another holder has
// used the resource since. Errors are a *StaleError matching ErrStale.
var ErrStale = errors.New("fence: stale token")

// ErrNoToken means the token is 0: lockd never grants 0, and a backend
// that issues no tokens (Redlock) cannot be fenced.
var ErrNoToken = errors.New("fence: no token")

// StaleError is the refusal of a stale token.
type StaleError struct {
	// Key is the resource the token was presented for.
	Key string
	// Token is the refused token.
	Token uint64
	// Highest is the highest token accepted for Key when it was refused,
	// 0 when the resource did not say (a conditional update).
	Highest uint64
}

// Error says which token was refused and why.
func (e *StaleError) Error() string {
	if e.Highest == 0 {
		return fmt.Sprintf("fence: stale token %d for %q: refused", e.Token, e.Key)
	}
	return fmt.Sprintf("fence: stale token %d for %q: %d was accepted already", e.Token, e.Key, e.Highest)
}

// Is makes a *StaleError match ErrStale.
func (e *StaleError) Is(target error) bool { return target == ErrStale }
