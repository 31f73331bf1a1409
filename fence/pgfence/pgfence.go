// Package pgfence fences writes to PostgreSQL with lock tokens: a write
// made under a lock commits only if no holder with a higher token has
// written the same key before. The check and the write are in one
// transaction, and the check takes the key's row lock until commit, so a
// stale holder's late write is refused however long it was paused.
//
// Two ways, both in docs/fencing.md:
//
//   - A fence table (Schema), one row per key, checked by Do or Admit in
//     the transaction that writes the protected data, which may live
//     anywhere in the same database.
//   - A fence_token column on the protected row itself, and a conditional
//     UPDATE … WHERE fence_token < $1 (UpdateSQL shows the shape): no extra
//     table, one statement; the row count says whether the write happened.
//
// Tokens are stored as bigint: lockd's tokens stay below 2^63 by
// construction; a larger token is refused with an error.
package pgfence

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockd-dev/lockd/fence"
)

// Schema creates the fence table: the highest token admitted per key.
const Schema = `CREATE TABLE IF NOT EXISTS lockd_fence (
	key   text   PRIMARY KEY,
	token bigint NOT NULL CHECK (token > 0)
)`

// admitSQL records token for key unless a higher one is recorded. The
// upsert locks the key's row until the transaction ends: a concurrent
// admit of the same key waits, then sees the committed token (READ
// COMMITTED re-checks the WHERE against the newest row version). No row
// back means a higher token was recorded: stale.
const admitSQL = `INSERT INTO lockd_fence (key, token) VALUES ($1, $2)
ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token
WHERE lockd_fence.token <= EXCLUDED.token
RETURNING token`

// UpdateSQL is the conditional-update pattern on a protected row that
// carries its own fence_token column, shown for a stock table: the update
// happens only if no write with this token or a higher one was made. Zero
// rows affected means refused (stale token, or no such row). Use <= in
// place of < to let one grant write the row more than once.
const UpdateSQL = `UPDATE stock SET qty = qty - 1, sold_to = $3, fence_token = $1
WHERE sku = $2 AND fence_token < $1`

// Querier is what Admit needs: a pgx.Tx (or a pgx.Conn, pgxpool.Pool or
// pgxpool.Conn, though then the row lock ends with the statement).
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Beginner starts transactions: *pgx.Conn, *pgxpool.Pool, *pgxpool.Conn.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Admit records token for key in the fence table within tx, or returns a
// *fence.StaleError (matching fence.ErrStale) when a higher token is
// recorded. Call it in the transaction that makes the protected write,
// before the write: the key's row stays locked until tx ends, so no other
// holder's write of the key can land in between. After a refusal, roll
// tx back.
func Admit(ctx context.Context, tx Querier, key string, token uint64) error {
	if token == 0 {
		return fmt.Errorf("admit %q: %w", key, fence.ErrNoToken)
	}
	if token > math.MaxInt64 {
		return fmt.Errorf("admit %q: token %d does not fit a bigint", key, token)
	}
	var got int64
	err := tx.QueryRow(ctx, admitSQL, key, int64(token)).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		var highest int64
		if err := tx.QueryRow(ctx, `SELECT token FROM lockd_fence WHERE key = $1`, key).Scan(&highest); err != nil {
			return fmt.Errorf("admit %q: read the fence: %w", key, err)
		}
		return &fence.StaleError{Key: key, Token: token, Highest: uint64(highest)}
	}
	if err != nil {
		return fmt.Errorf("admit %q: %w", key, err)
	}
	return nil
}

// Do runs f in a transaction that first admits token for key (Admit), and
// commits if f returns nil. A stale token rolls back without running f and
// returns a *fence.StaleError; f's error rolls back and is returned as is.
func Do(ctx context.Context, db Beginner, key string, token uint64, f func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := Admit(ctx, tx, key, token); err != nil {
			return err
		}
		return f(tx)
	})
}

// Stale turns the result of a conditional update (UpdateSQL's pattern)
// into an error: nil when it changed rows, else a *fence.StaleError for
// key and token (the row's token is not read: Highest is 0). Zero rows
// also when the row does not exist: tell the two apart in the query if it
// matters.
func Stale(rowsAffected int64, key string, token uint64) error {
	if rowsAffected > 0 {
		return nil
	}
	return &fence.StaleError{Key: key, Token: token}
}

// Execer runs a statement: *pgx.Conn, pgx.Tx, *pgxpool.Pool.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Setup creates the fence table if it does not exist.
func Setup(ctx context.Context, db Execer) error {
	if _, err := db.Exec(ctx, Schema); err != nil {
		return fmt.Errorf("create the fence table: %w", err)
	}
	return nil
}
