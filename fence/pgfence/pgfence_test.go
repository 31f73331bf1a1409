package pgfence_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/lockd-dev/lockd/fence"
	"github.com/lockd-dev/lockd/fence/pgfence"
	"github.com/lockd-dev/lockd/internal/pgtest"
)

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// TestPgfence runs against a real PostgreSQL server: the fence table
// admits tokens in order and refuses lower ones, and a transaction holding
// a newer admit makes an older one wait and then refuses it; the
// conditional update refuses a stale token.
func TestPgfence(t *testing.T) {
	dsn := pgtest.Start(t)
	ctx := t.Context()
	db := connect(t, dsn)
	if err := pgfence.Setup(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `CREATE TABLE ledger (key text, token bigint, note text)`); err != nil {
		t.Fatal(err)
	}
	write := func(key string, token uint64, note string) error {
		return pgfence.Do(ctx, db, key, token, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, $2, $3)`, key, int64(token), note)
			return err
		})
	}

	t.Run("order", func(t *testing.T) {
		for _, tt := range []struct {
			token   uint64
			stale   bool
			highest uint64
		}{{5, false, 0}, {7, false, 0}, {7, false, 0}, {6, true, 7}, {1, true, 7}, {8, false, 0}} {
			err := write("order", tt.token, "")
			var se *fence.StaleError
			switch {
			case tt.stale && (!errors.As(err, &se) || se.Highest != tt.highest || !errors.Is(err, fence.ErrStale)):
				t.Errorf("token %d: %v, want a StaleError with highest %d", tt.token, err, tt.highest)
			case !tt.stale && err != nil:
				t.Errorf("token %d: %v, want admitted", tt.token, err)
			}
		}
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM ledger WHERE key = 'order'`).Scan(&n); err != nil || n != 4 {
			t.Errorf("ledger rows: %d, %v; want 4 (the stale writes rolled back)", n, err)
		}
		if err := write("order", 0, ""); !errors.Is(err, fence.ErrNoToken) {
			t.Errorf("token 0: %v, want ErrNoToken", err)
		}
		// f's error rolls back, and the token stays unrecorded.
		boom := errors.New("boom")
		err := pgfence.Do(ctx, db, "rollback", 3, func(pgx.Tx) error { return boom })
		if !errors.Is(err, boom) {
			t.Errorf("f's error: %v", err)
		}
		if err := write("rollback", 2, ""); err != nil {
			t.Errorf("token 2 after a rolled-back 3: %v, want admitted", err)
		}
	})

	t.Run("concurrent", func(t *testing.T) {
		// A newer holder's transaction admits 10 and is still open: an
		// older holder's admit of 9 waits for it, and is refused once it
		// commits.
		other := connect(t, dsn)
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if err := pgfence.Admit(ctx, tx, "race", 10); err != nil {
			t.Fatal(err)
		}
		res := make(chan error, 1)
		go func() {
			res <- pgfence.Do(ctx, other, "race", 9, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ('race', 9, 'stale')`)
				return err
			})
		}()
		if _, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ('race', 10, 'new')`); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-res; !errors.Is(err, fence.ErrStale) {
			t.Fatalf("older admit after the newer commit: %v, want ErrStale", err)
		}
		var notes []string
		rows, _ := db.Query(ctx, `SELECT note FROM ledger WHERE key = 'race'`)
		notes, err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(notes) != 1 || notes[0] != "new" {
			t.Errorf("race ledger: %v, %v; want only the newer write", notes, err)
		}
	})

	t.Run("conditional-update", func(t *testing.T) {
		if _, err := db.Exec(ctx, `CREATE TABLE stock (sku text PRIMARY KEY, qty int, sold_to text, fence_token bigint NOT NULL DEFAULT 0)`); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(ctx, `INSERT INTO stock (sku, qty) VALUES ('laptop', 2)`); err != nil {
			t.Fatal(err)
		}
		sell := func(token uint64, to string) error {
			tag, err := db.Exec(ctx, pgfence.UpdateSQL, int64(token), "laptop", to)
			if err != nil {
				return err
			}
			return pgfence.Stale(tag.RowsAffected(), "laptop", token)
		}
		if err := sell(20, "b"); err != nil {
			t.Fatal(err)
		}
		if err := sell(19, "a"); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("stale sale: %v, want ErrStale", err)
		}
		if err := sell(20, "b"); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("second sale with the same token: %v, want ErrStale (< allows one write per grant)", err)
		}
		var qty int
		var to string
		if err := db.QueryRow(ctx, `SELECT qty, sold_to FROM stock WHERE sku = 'laptop'`).Scan(&qty, &to); err != nil || qty != 1 || to != "b" {
			t.Errorf("stock: %d sold to %q, %v; want 1 left, sold to b", qty, to, err)
		}
	})
}
