package pgfence_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/fence"
	"github.com/lockd-dev/lockd/fence/pgfence"
	"github.com/lockd-dev/lockd/internal/pgtest"
	"github.com/lockd-dev/lockd/lockdtest"
)

// TestPausedHolder, against a real PostgreSQL
// server and a real lockd node: holder A takes the lock and is paused past
// its lease (lockdtest.Pause: none of its requests leave, so the server
// expires its session); B is granted the lock and writes; A resumes and
// writes with its old token, never having looked at its lease. The
// database keeps B's write and refuses A's.
func TestPausedHolder(t *testing.T) {
	dsn := pgtest.Start(t)
	srv := lockdtest.New(t)
	ctx := t.Context()
	db := connect(t, dsn)
	if err := pgfence.Setup(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `CREATE TABLE stock (sku text PRIMARY KEY, qty int, sold_to text)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO stock VALUES ('laptop', 1, '')`); err != nil {
		t.Fatal(err)
	}
	sell := func(token uint64, to string) error {
		return pgfence.Do(ctx, db, "stock/laptop", token, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE stock SET qty = qty - 1, sold_to = $1 WHERE sku = 'laptop'`, to)
			return err
		})
	}

	pause := lockdtest.NewPause(nil)
	ca, err := lockd.New(lockd.WithEndpoints(srv.URL()), lockd.WithHTTPClient(&http.Client{Transport: pause}), lockd.WithStream(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pause.Resume(); ca.Close(context.Background()) })
	cb, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cb.Close(context.Background()) })
	sa, err := ca.NewSession(ctx, lockd.WithTTL(time.Second), lockd.WithOwner("server-a"))
	if err != nil {
		t.Fatal(err)
	}
	sb, err := cb.NewSession(ctx, lockd.WithOwner("server-b"))
	if err != nil {
		t.Fatal(err)
	}
	ma, mb := sa.NewMutex("stock/laptop"), sb.NewMutex("stock/laptop")
	if err := ma.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	tokenA := ma.Token() // A checked it holds the lock, decided to sell...
	pause.Pause()        // ...and stops right there.

	lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := mb.Lock(lctx); err != nil { // granted once A's session expires
		t.Fatalf("B: %v", err)
	}
	if err := sell(mb.Token(), "b"); err != nil {
		t.Fatalf("B's sale: %v", err)
	}

	pause.Resume()
	err = sell(tokenA, "a")
	var se *fence.StaleError
	if !errors.As(err, &se) || se.Highest != mb.Token() {
		t.Fatalf("A's late sale with token %d: %v; want a StaleError naming B's token %d", tokenA, err, mb.Token())
	}
	var qty int
	var to string
	if err := db.QueryRow(ctx, `SELECT qty, sold_to FROM stock WHERE sku = 'laptop'`).Scan(&qty, &to); err != nil || qty != 0 || to != "b" {
		t.Fatalf("stock: qty %d sold to %q, %v; want 0, sold to b", qty, to, err)
	}
	// Had A looked, its client would have told it: the lease is gone.
	if err := ma.Err(); !errors.Is(err, lockd.ErrLeaseLost) {
		t.Errorf("A's Err after the pause: %v, want ErrLeaseLost", err)
	}
}
