package lockd

import (
	"context"
	"fmt"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"

	"github.com/lockd-dev/lockd/internal/wire"
)

// TokenStatus is what the cluster says about a fencing token.
type TokenStatus struct {
	// Current is true when the token is a grant the cluster counts now:
	// its holder has not released it, completed it or lost its lease.
	Current bool
	// SessionID is the session holding the grant, when Current.
	SessionID string
	// Shared is true when the grant is a shared (read or semaphore) hold.
	Shared bool
}

// CheckToken asks the cluster whether token is a current grant of lock
// name. The read is linearizable (served by the leader after it confirmed
// its leadership, never from a follower's possibly stale state), so a
// token released, completed or expired before the call started is never
// reported current.
//
// A resource that cannot keep the highest token it has seen (see package
// fence) can call CheckToken before it acts on a request. The answer is
// true at some instant during the call: the grant may end right after, so
// a fence that remembers tokens is the stronger guard; CheckToken is for
// the callers that cannot keep one. Errors match ErrInvalidArgument (a bad
// name) or ErrUnavailable (no leader answered in time).
func (c *Client) CheckToken(ctx context.Context, name string, token uint64) (TokenStatus, error) {
	msg := &lockdv1.CheckTokenRequest{Name: name, Token: token}
	resp, err := wire.CheckToken.Invoke(ctx, c.call, wire.CheckToken.PolicyOf(msg), msg, nil)
	if err != nil {
		return TokenStatus{}, fmt.Errorf("check token %d of %q: %w", token, name, err)
	}
	m := resp.Msg
	return TokenStatus{Current: m.GetValid(), SessionID: m.GetSessionId(), Shared: m.GetMode() == lockdv1.Mode_MODE_SHARED}, nil
}

// CheckToken asks the cluster whether this mutex's current hold is still
// a current grant (Client.CheckToken with Token()). It returns false
// without asking when the mutex is not held. The client's own view (Err,
// Done) already ends strictly before the server may end the grant; this
// asks the server itself, for code that hands the token on and wants the
// cluster's word.
func (m *Mutex) CheckToken(ctx context.Context) (bool, error) {
	return m.l.checkToken(ctx)
}

// CheckToken is Mutex.CheckToken for the held permit.
func (m *Semaphore) CheckToken(ctx context.Context) (bool, error) {
	return m.l.checkToken(ctx)
}

// CheckToken is Mutex.CheckToken for the current hold, read or write.
func (m *RWMutex) CheckToken(ctx context.Context) (bool, error) {
	return m.l.checkToken(ctx)
}

func (l *lock) checkToken(ctx context.Context) (bool, error) {
	token := l.token()
	if token == 0 {
		return false, nil
	}
	st, err := l.s.c.CheckToken(ctx, l.name, token)
	if err != nil {
		return false, err
	}
	return st.Current && st.SessionID == l.s.id, nil
}
