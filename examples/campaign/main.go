// Command campaign sends an email campaign from one of five workers.
//
// All five workers start at once and campaign in the election
// "campaigns/black-friday" (Election.Campaign); the server queues them in
// order and makes one the leader. Only the leader sends. Here the first
// leader stops halfway (its process exits: Session.Close); the next worker
// in line becomes the leader and sends the rest, reading what was sent
// from the outbox. The outbox takes each send through a fence.Guard with
// the leader's token, so a deposed leader that wakes up late cannot send
// again. When the campaign is done, every later leader sees so and
// resigns.
//
//	lockd serve &
//	go run ./examples/campaign
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/fence"
)

func main() {
	endpoint := flag.String("endpoints", lockd.DefaultEndpoint, "lockd endpoint")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var to []string
	for i := range 10 {
		to = append(to, fmt.Sprintf("customer%d@example.com", i+1))
	}
	o, err := run(ctx, *endpoint, 5, to, 4)
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range o.sent {
		fmt.Printf("%s sent by %s (token %d)\n", s.to, s.by, s.token)
	}
}

const campaign = "campaigns/black-friday"

// send is one email sent.
type send struct {
	to, by string
	token  uint64
}

// outbox stands for the mail service: each send is admitted by the guard
// with the sender's leadership token.
type outbox struct {
	guard fence.Guard
	mu    sync.Mutex
	sent  []send
	done  bool
}

func (o *outbox) send(to, by string, token uint64) error {
	return o.guard.Do(campaign, token, func() error {
		o.mu.Lock()
		defer o.mu.Unlock()
		for _, s := range o.sent {
			if s.to == to {
				return nil // sent already, by an earlier leader
			}
		}
		o.sent = append(o.sent, send{to: to, by: by, token: token})
		return nil
	})
}

func (o *outbox) finish(token uint64) error {
	return o.guard.Do(campaign, token, func() error {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.done = true
		return nil
	})
}

func (o *outbox) isDone() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.done
}

// run starts workers workers; the first leader stops after stopAfter
// emails. It returns the outbox once every worker has returned.
func run(ctx context.Context, endpoint string, workers int, to []string, stopAfter int) (*outbox, error) {
	var o outbox
	var first sync.Once
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for i := range workers {
		wg.Go(func() {
			errs[i] = worker(ctx, endpoint, fmt.Sprintf("worker-%d", i+1), &o, to, func() int {
				n := len(to)
				first.Do(func() { n = stopAfter })
				return n
			})
		})
	}
	wg.Wait()
	return &o, errors.Join(errs...)
}

// worker campaigns, and once leader sends what is left (at most quota()
// emails, then it stops as if its process exited).
func worker(ctx context.Context, endpoint, name string, o *outbox, to []string, quota func() int) error {
	c, err := lockd.New(lockd.WithEndpoints(endpoint))
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	s, err := c.NewSession(ctx, lockd.WithOwner(name))
	if err != nil {
		return err
	}
	e := s.NewElection(campaign)
	if err := e.Campaign(ctx, []byte(name)); err != nil {
		return fmt.Errorf("%s: campaign: %w", name, err)
	}
	if o.isDone() {
		return e.Resign(ctx)
	}
	n := quota()
	for i, addr := range to {
		if i == n {
			// This process exits halfway: its session ends, the next
			// candidate in line leads.
			return s.Close(ctx)
		}
		if err := e.Err(); err != nil {
			return fmt.Errorf("%s: leadership lost: %w", name, err)
		}
		if err := o.send(addr, name, e.Token()); err != nil {
			return fmt.Errorf("%s: send: %w", name, err)
		}
	}
	if err := o.finish(e.Token()); err != nil {
		return err
	}
	return e.Resign(ctx)
}
