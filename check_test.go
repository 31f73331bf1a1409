package lockd_test

import (
	"errors"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/lockdtest"
)

// TestCheckToken: the cluster tells a current token from a stale one: a
// released holder's, a completed holder's and a closed session's tokens
// are stale; the new holder's is current; a read lock's token is shared.
func TestCheckToken(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv)
	ctx := t.Context()
	a, b := newSession(t, c), newSession(t, c)

	ma := a.NewMutex("stock/laptop")
	if ok, err := ma.CheckToken(ctx); ok || err != nil {
		t.Fatalf("CheckToken before Lock: %v, %v; want false, nil", ok, err)
	}
	if err := ma.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	old := ma.Token()
	st, err := c.CheckToken(ctx, "stock/laptop", old)
	if err != nil || !st.Current || st.SessionID != a.ID() || st.Shared {
		t.Fatalf("held token: %+v, %v; want current, held by %s, exclusive", st, err, a.ID())
	}
	if ok, err := ma.CheckToken(ctx); !ok || err != nil {
		t.Fatalf("Mutex.CheckToken while held: %v, %v", ok, err)
	}
	if err := ma.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	mb := b.NewMutex("stock/laptop")
	if err := mb.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		token uint64
		want  bool
	}{{old, false}, {mb.Token(), true}, {mb.Token() + 1, false}, {0, false}} {
		st, err := c.CheckToken(ctx, "stock/laptop", tt.token)
		if err != nil || st.Current != tt.want {
			t.Errorf("CheckToken(%d): %+v, %v; want current=%v", tt.token, st, err, tt.want)
		}
	}
	// Completed: the mark is not a grant.
	done := mb.Token()
	if err := mb.Complete(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	if st, err := c.CheckToken(ctx, "stock/laptop", done); err != nil || st.Current {
		t.Errorf("completed token: %+v, %v; want stale", st, err)
	}
	// A closed session's grant is gone with it.
	rw := a.NewRWMutex("catalog")
	if err := rw.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	read := rw.Token()
	if st, err := c.CheckToken(ctx, "catalog", read); err != nil || !st.Current || !st.Shared {
		t.Errorf("read lock token: %+v, %v; want current and shared", st, err)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := c.CheckToken(ctx, "catalog", read); err != nil || st.Current {
		t.Errorf("closed session's token: %+v, %v; want stale", st, err)
	}
	if _, err := c.CheckToken(ctx, "", 1); !errors.Is(err, lockd.ErrInvalidArgument) {
		t.Errorf("empty name: %v, want ErrInvalidArgument", err)
	}
}
