// Command webhook applies a payment provider's webhook exactly once, though
// the provider delivers it twice, to two servers behind a load balancer, at
// the same moment, and once more later.
//
// Each delivery takes the lock named by the event id. The first to get it
// writes the ledger entry and completes the lock (Mutex.Complete): the
// other delivery, queued behind it, and every later retry get
// ErrAlreadyDone, answer 200 and write nothing. If the first handler
// crashes before Complete, its lease ends, the lock is free and the next
// delivery writes the entry: exactly once, not at most once.
//
//	lockd serve &
//	go run ./examples/webhook
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/lockd-dev/lockd"
)

func main() {
	endpoint := flag.String("endpoints", lockd.DefaultEndpoint, "lockd endpoint")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := run(ctx, *endpoint, event{ID: "evt_1P9", Account: "acct_42", Cents: 129900})
	if err != nil {
		log.Fatal(err)
	}
	for _, a := range res.answers {
		fmt.Println(a)
	}
	fmt.Printf("ledger: %d entr(ies): %+v\n", len(res.ledger), res.ledger)
}

// event is the webhook's payload.
type event struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Cents   int64  `json:"cents"`
}

// ledger stands for the payments database shared by the servers.
type ledger struct {
	mu      sync.Mutex
	entries []event
}

func (l *ledger) add(e event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = append(l.entries, e)
}

// result is what the provider was told and what the ledger holds.
type result struct {
	answers []string
	ledger  []event
}

// run starts two HTTP servers sharing one ledger, delivers e to both at
// once, then once more to the first, and returns the answers and the
// ledger.
func run(ctx context.Context, endpoint string, e event) (result, error) {
	var l ledger
	var urls []string
	for i := range 2 {
		u, stop, err := startServer(ctx, endpoint, fmt.Sprintf("web-%d", i+1), &l)
		if err != nil {
			return result{}, err
		}
		defer stop()
		urls = append(urls, u)
	}
	var res result
	var mu sync.Mutex
	deliver := func(u string) error {
		body, _ := json.Marshal(e)
		resp, err := http.Post(u+"/webhooks/payments", "application/json", bytes.NewReader(body))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		mu.Lock()
		defer mu.Unlock()
		res.answers = append(res.answers, fmt.Sprintf("%d %s", resp.StatusCode, b.String()))
		return nil
	}
	var wg sync.WaitGroup
	errs := make([]error, len(urls))
	for i, u := range urls { // the duplicate delivery, at the same moment
		wg.Go(func() { errs[i] = deliver(u) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return result{}, err
	}
	if err := deliver(urls[0]); err != nil { // the provider's retry
		return result{}, err
	}
	l.mu.Lock()
	res.ledger = append(res.ledger, l.entries...)
	l.mu.Unlock()
	return res, nil
}

// startServer runs one web server with its own lockd client and session.
func startServer(ctx context.Context, endpoint, name string, l *ledger) (string, func(), error) {
	c, err := lockd.New(lockd.WithEndpoints(endpoint))
	if err != nil {
		return "", nil, err
	}
	s, err := c.NewSession(ctx, lockd.WithOwner(name))
	if err != nil {
		c.Close(context.Background())
		return "", nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /webhooks/payments", func(w http.ResponseWriter, r *http.Request) {
		var e event
		if err := json.NewDecoder(r.Body).Decode(&e); err != nil || e.ID == "" {
			http.Error(w, "bad event", http.StatusBadRequest)
			return
		}
		msg, err := handle(r.Context(), s, l, e)
		if err != nil {
			// 5xx: the provider retries later.
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "%s: %s", name, msg)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.Close(context.Background())
		return "", nil, err
	}
	hs := &http.Server{Handler: mux}
	go hs.Serve(ln)
	stop := func() {
		hs.Close()
		c.Close(context.Background())
	}
	return "http://" + ln.Addr().String(), stop, nil
}

// handle applies e once: lock per event id, write, Complete.
func handle(ctx context.Context, s *lockd.Session, l *ledger, e event) (string, error) {
	m := s.NewMutex("webhooks/payments/" + e.ID)
	err := m.Lock(ctx)
	var done *lockd.DoneError
	if errors.As(err, &done) {
		return "duplicate, applied by " + done.Owner, nil
	}
	if err != nil {
		return "", err
	}
	l.add(e) // in a real service: one database transaction
	// Keep the mark longer than the provider retries (days).
	if err := m.Complete(ctx, 7*24*time.Hour); err != nil {
		return "", err
	}
	return "applied", nil
}
