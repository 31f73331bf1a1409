// Command laptop sells the last laptop in stock from two servers, one of
// which is paused mid-sale past its lease, and shows the PostgreSQL fence
// refusing the paused server's late write.
//
// Server A takes the lock "stock/laptop", sees one laptop left and stops
// (a long GC pause, here a transport that holds every request, keepalives
// included). Its lease runs out; server B is granted the lock and sells the
// laptop. A wakes up and, sure it still holds the lock, sells it too. The
// stock row carries the token of the last write, and the sale is a
// conditional UPDATE … WHERE fence_token < $1 (fence/pgfence.UpdateSQL):
// A's token is older than B's, so A's UPDATE changes nothing and A tells
// its customer "sold out". A TTL alone cannot do this; the token can.
//
//	lockd serve &
//	go run ./examples/laptop -dsn postgres://postgres@127.0.0.1:5432/postgres
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/fence"
	"github.com/lockd-dev/lockd/fence/pgfence"
	"github.com/lockd-dev/lockd/lockdtest"
)

func main() {
	endpoint := flag.String("endpoints", lockd.DefaultEndpoint, "lockd endpoint")
	dsn := flag.String("dsn", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "PostgreSQL connection string")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := run(ctx, *endpoint, *dsn)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("A (paused): %s\nB: %s\nstock: %d left, sold to %s\n", res.a, res.b, res.qty, res.soldTo)
}

// outcome is what each server told its customer and what the database
// holds.
type outcome struct {
	a, b   string
	qty    int
	soldTo string
}

const schema = `
DROP TABLE IF EXISTS stock;
CREATE TABLE stock (sku text PRIMARY KEY, qty int NOT NULL, sold_to text, fence_token bigint NOT NULL DEFAULT 0);
INSERT INTO stock (sku, qty) VALUES ('laptop', 1);`

// run plays the scenario against a lockd endpoint and a database.
func run(ctx context.Context, endpoint, dsn string) (outcome, error) {
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return outcome{}, err
	}
	defer db.Close(context.Background())
	if _, err := db.Exec(ctx, schema); err != nil {
		return outcome{}, err
	}

	// Server A's requests go through a transport that can pause, so that
	// its keepalives stop as a paused process's would. Unary calls only:
	// an open stream would carry them past the pause.
	pause := lockdtest.NewPause(nil) // holds A's requests, like a stopped process
	ca, err := lockd.New(lockd.WithEndpoints(endpoint), lockd.WithHTTPClient(&http.Client{Transport: pause}), lockd.WithStream(false))
	if err != nil {
		return outcome{}, err
	}
	defer func() { pause.Resume(); ca.Close(context.Background()) }()
	cb, err := lockd.New(lockd.WithEndpoints(endpoint))
	if err != nil {
		return outcome{}, err
	}
	defer cb.Close(context.Background())
	sa, err := ca.NewSession(ctx, lockd.WithTTL(time.Second), lockd.WithOwner("server-a"))
	if err != nil {
		return outcome{}, err
	}
	sb, err := cb.NewSession(ctx, lockd.WithOwner("server-b"))
	if err != nil {
		return outcome{}, err
	}

	var res outcome
	ma := sa.NewMutex("stock/laptop")
	if err := ma.Lock(ctx); err != nil {
		return outcome{}, err
	}
	tokenA := ma.Token()
	if left, err := inStock(ctx, db); err != nil || left != 1 {
		return outcome{}, fmt.Errorf("buyer A sees %d left: %v", left, err)
	}
	pause.Pause() // A stops between its check and its write

	mb := sb.NewMutex("stock/laptop")
	if err := mb.Lock(ctx); err != nil { // granted when A's session expires
		return outcome{}, err
	}
	if res.b, err = sell(ctx, db, mb.Token(), "b"); err != nil {
		return outcome{}, err
	}
	if err := mb.Unlock(ctx); err != nil {
		return outcome{}, err
	}

	pause.Resume() // A wakes up, still sure it holds the lock
	if res.a, err = sell(ctx, db, tokenA, "a"); err != nil {
		return outcome{}, err
	}
	err = db.QueryRow(ctx, `SELECT qty, sold_to FROM stock WHERE sku = 'laptop'`).Scan(&res.qty, &res.soldTo)
	return res, err
}

func inStock(ctx context.Context, db *pgx.Conn) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT qty FROM stock WHERE sku = 'laptop'`).Scan(&n)
	return n, err
}

// sell is the fenced write: it changes the row only if no sale with this
// token or a newer one was made.
func sell(ctx context.Context, db *pgx.Conn, token uint64, to string) (string, error) {
	tag, err := db.Exec(ctx, pgfence.UpdateSQL, int64(token), "laptop", to)
	if err != nil {
		return "", err
	}
	if err := pgfence.Stale(tag.RowsAffected(), "laptop", token); errors.Is(err, fence.ErrStale) {
		return fmt.Sprintf("refused (token %d is stale): sold out", token), nil
	}
	return fmt.Sprintf("sold (token %d)", token), nil
}
