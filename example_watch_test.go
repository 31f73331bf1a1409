package lockd_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/lockd-dev/lockd"
)

// A dashboard follows the invoice locks as they are taken and released.
// Watch resumes by itself after a broken connection; a reset means events
// were lost and the state must be read again.
func ExampleClient_Watch() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client, err := lockd.New(lockd.WithEndpoints(endpoint))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(context.Background())
	s, err := client.NewSession(ctx, lockd.WithOwner("billing-1"))
	if err != nil {
		log.Fatal(err)
	}
	// Start the watch where the state is: the holds now, then the changes.
	events := client.Watch(ctx, "example-watch/", lockd.WatchState())
	worked, started := make(chan struct{}), false
	work := func() {
		defer close(worked)
		m := s.NewMutex("example-watch/2025-02")
		if err := m.Lock(ctx); err != nil {
			log.Fatal(err)
		}
		if err := m.Unlock(ctx); err != nil {
			log.Fatal(err)
		}
	}
	for ev, err := range events {
		if errors.Is(err, lockd.ErrWatchReset) {
			continue // the state follows (WatchState)
		}
		if err != nil {
			log.Fatal(err)
		}
		if ev.Kind == lockd.EventSynced {
			// The watch is open (iterating opens it): now do the work.
			fmt.Println("synced")
			if !started {
				started = true
				go work()
			}
			continue
		}
		fmt.Println(ev.Kind, ev.Name, ev.Owner)
		if ev.Kind == lockd.EventReleased {
			break
		}
	}
	<-worked
	// Output:
	// synced
	// GRANTED example-watch/2025-02 billing-1
	// RELEASED example-watch/2025-02 billing-1
}

// Observers see each change of leader, in order; the leader can change
// what it announces without giving up leadership.
func ExampleElection_Observe() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client, err := lockd.New(lockd.WithEndpoints(endpoint))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(context.Background())
	s, err := client.NewSession(ctx, lockd.WithOwner("worker-1"))
	if err != nil {
		log.Fatal(err)
	}
	e := s.NewElection("example-observe/campaign")
	n := 0
	campaigned := make(chan struct{})
	for leader, err := range client.ObserveElection(ctx, "example-observe/campaign") {
		if err != nil {
			log.Fatal(err)
		}
		if leader.Token == 0 {
			fmt.Println("no leader")
		} else {
			fmt.Printf("%s leads: %s\n", leader.Owner, leader.Value)
		}
		switch n++; n {
		case 1:
			go func() {
				defer close(campaigned)
				if err := e.Campaign(ctx, []byte("starting")); err != nil {
					log.Fatal(err)
				}
			}()
		case 2:
			<-campaigned // observers may hear of it before Campaign returns
			if err := e.Proclaim(ctx, []byte("sending")); err != nil {
				log.Fatal(err)
			}
		case 3:
			if err := e.Resign(ctx); err != nil {
				log.Fatal(err)
			}
		default:
			return
		}
	}
	// Output:
	// no leader
	// worker-1 leads: starting
	// worker-1 leads: sending
	// no leader
}
