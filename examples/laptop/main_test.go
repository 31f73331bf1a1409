package main

import (
	"strings"
	"testing"

	"github.com/lockd-dev/lockd/internal/pgtest"
	"github.com/lockd-dev/lockd/lockdtest"
)

// TestLastLaptop (real PostgreSQL, real lockd node): B sells the last
// laptop; paused A's late sale is refused by the fence; the row says sold
// to B, none left.
func TestLastLaptop(t *testing.T) {
	dsn := pgtest.Start(t)
	srv := lockdtest.New(t)
	res, err := run(t.Context(), srv.URL(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.b, "sold") || !strings.HasPrefix(res.a, "refused") || res.qty != 0 || res.soldTo != "b" {
		t.Fatalf("got %+v; want B sold, A refused, 0 left, sold to b", res)
	}
}
