package pgfence_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/lockd-dev/lockd/fence"
	"github.com/lockd-dev/lockd/fence/pgfence"
	"github.com/lockd-dev/lockd/internal/pgtest"
)

// exampleDSN is the PostgreSQL server the examples run against, started by
// TestMain.
var exampleDSN string

// TestMain starts a real PostgreSQL server for the examples. Without one
// installed the examples are skipped (an example cannot skip itself),
// except under CI=true, where they run and fail.
func TestMain(m *testing.M) {
	flag.Parse()
	pg, err := pgtest.Launch()
	switch {
	case errors.Is(err, pgtest.ErrNotInstalled) && os.Getenv("CI") != "true":
		fmt.Fprintf(os.Stderr, "pgtest: %v: skipping the examples\n", err)
		_ = flag.Set("test.skip", "^Example")
	case err != nil:
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
	default:
		exampleDSN = pg.DSN
	}
	code := m.Run()
	if pg != nil {
		if err := pg.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	os.Exit(code)
}

// A holder paused past its lease writes late: by then the next holder,
// with a larger token, has written, and the late write is refused inside
// the same transaction that would have made it.
func ExampleDo() {
	ctx := context.Background()
	db, err := pgx.Connect(ctx, exampleDSN)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close(ctx)
	if err := pgfence.Setup(ctx, db); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := db.Exec(ctx, `CREATE TABLE invoices (month text PRIMARY KEY, sent_by bigint)`); err != nil {
		fmt.Println(err)
		return
	}
	send := func(token uint64) error {
		return pgfence.Do(ctx, db, "invoices/2026-11", token, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO invoices VALUES ('2026-11', $1)
				ON CONFLICT (month) DO UPDATE SET sent_by = $1`, int64(token))
			return err
		})
	}
	fmt.Println("the new holder (token 8) writes:", send(8))
	err = send(7)
	fmt.Println("the paused holder (token 7) is refused:", errors.Is(err, fence.ErrStale))
	var sentBy int64
	_ = db.QueryRow(ctx, `SELECT sent_by FROM invoices`).Scan(&sentBy)
	fmt.Println("the row was written by token", sentBy)
	// Output:
	// the new holder (token 8) writes: <nil>
	// the paused holder (token 7) is refused: true
	// the row was written by token 8
}
