package main

import (
	"fmt"
	"testing"

	"github.com/lockd-dev/lockd/lockdtest"
)

// TestCampaignOnce: five workers; one leads and starts the campaign, stops
// after 4 emails; the next leader sends the other 6. Every email goes out
// exactly once, by two leaders in turn, with increasing tokens.
func TestCampaignOnce(t *testing.T) {
	srv := lockdtest.New(t)
	var to []string
	for i := range 10 {
		to = append(to, fmt.Sprintf("c%d@example.com", i))
	}
	o, err := run(t.Context(), srv.URL(), 5, to, 4)
	if err != nil {
		t.Fatal(err)
	}
	if !o.done || len(o.sent) != len(to) {
		t.Fatalf("done %v, %d sent; want done, %d sent", o.done, len(o.sent), len(to))
	}
	var leaders []string
	for i, s := range o.sent {
		if s.to != to[i] {
			t.Errorf("email %d went to %s, want %s (each once, in order)", i, s.to, to[i])
		}
		if i == 0 || s.by != o.sent[i-1].by {
			leaders = append(leaders, s.by)
		}
		if i > 0 && s.token < o.sent[i-1].token {
			t.Errorf("token went back: %d after %d", s.token, o.sent[i-1].token)
		}
	}
	if len(leaders) != 2 || o.sent[3].by == o.sent[4].by {
		t.Errorf("senders %v (split after email 4: %s, %s); want the first leader for 4 emails, then one other", leaders, o.sent[3].by, o.sent[4].by)
	}
}
