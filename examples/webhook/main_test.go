package main

import (
	"strings"
	"testing"

	"github.com/lockd-dev/lockd/lockdtest"
)

// TestWebhookOnce: the same payment event delivered to two servers at once
// and retried once more makes one ledger entry; every delivery is answered
// 200, one "applied" and two "duplicate".
func TestWebhookOnce(t *testing.T) {
	srv := lockdtest.New(t)
	e := event{ID: "evt_1P9", Account: "acct_42", Cents: 129900}
	res, err := run(t.Context(), srv.URL(), e)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.ledger) != 1 || res.ledger[0] != e {
		t.Fatalf("ledger: %+v; want exactly one entry for %+v", res.ledger, e)
	}
	applied, dup := 0, 0
	for _, a := range res.answers {
		switch {
		case strings.HasPrefix(a, "200 ") && strings.HasSuffix(a, ": applied"):
			applied++
		case strings.HasPrefix(a, "200 ") && strings.Contains(a, "duplicate, applied by web-"):
			dup++
		default:
			t.Errorf("answer %q", a)
		}
	}
	if applied != 1 || dup != 2 {
		t.Errorf("answers %q: want 1 applied and 2 duplicates", res.answers)
	}
}
