package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd"
)

// Broken modes: deliberate client bugs, to show the checker catches them.
const (
	brokenNone = ""
	// brokenIgnoreLease: Go workers ignore lease loss and the register's
	// rejections and keep their critical section going (like a `lockd
	// run` that keeps its child past the deadline).
	brokenIgnoreLease = "ignore-lease"
	// brokenUnsafeRevoke: the admin-revoke fault passes unsafe_now, so the
	// server expires the holder's session and grants the lock again at
	// once, while the holder still believes it holds it (a server that
	// expires sessions early; lockd documents the flag as unsafe).
	brokenUnsafeRevoke = "unsafe-revoke"
)

// reporter sends events to the register.
type reporter struct {
	url  string
	slot string
	hc   *http.Client
}

func newReporter(url, slot string) *reporter {
	return &reporter{url: url, slot: slot, hc: &http.Client{Timeout: 5 * time.Second}}
}

// errStale is the register's answer to a fenced message with a stale token.
var errStale = errors.New("register rejected a stale token")

// send posts e (stamped with the slot and the send time) and returns
// errStale when the register rejected it.
func (r *reporter) send(ctx context.Context, e Event) error {
	e.Slot = r.slot
	if e.Sent == 0 {
		e.Sent = time.Now().UnixNano()
	}
	b, err := json.Marshal(&e)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url+"/event", bytes.NewReader(b))
	if err != nil {
		return err
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	switch resp.StatusCode {
	case http.StatusOK:
		return nil
	case http.StatusConflict:
		return errStale
	}
	return fmt.Errorf("register: %s", resp.Status)
}

// workerConfig is `chaos worker`'s flags.
type workerConfig struct {
	register, slot, broken string
	backend                string
	endpoints, locks       []string
	ttl                    time.Duration
	until                  time.Time
	seed                   uint64
	maxOps                 int
	// setLocks are the names sets are drawn from (empty: no sets).
	setLocks []string
	// pair makes the worker a lock-order inversion pair (sets.go).
	pair bool
}

func parseWorker(args []string) (*workerConfig, error) {
	var c workerConfig
	fs := flag.NewFlagSet("chaos worker", flag.ContinueOnError)
	fs.StringVar(&c.register, "register", "", "register URL")
	fs.StringVar(&c.slot, "slot", "w0", "client slot name")
	fs.StringVar(&c.broken, "broken", "", "deliberate client bug: ignore-lease")
	fs.StringVar(&c.backend, "backend", backendLockd, "lockd, or redis (--endpoints are then Redis host:port; several: Redlock)")
	eps := fs.String("endpoints", "", "comma-separated lockd API URLs")
	locks := fs.String("locks", "chaos/a", "comma-separated lock names")
	fs.DurationVar(&c.ttl, "ttl", 2*time.Second, "session TTL")
	until := fs.Int64("until", 0, "stop at this Unix time in nanoseconds")
	fs.Uint64Var(&c.seed, "seed", 1, "random seed")
	fs.IntVar(&c.maxOps, "max-ops", 100_000, "stop after this many critical sections")
	setLocks := fs.String("set-locks", "", "comma-separated names a third of the critical sections take 2 to 4 of as one MultiLock (empty: none)")
	fs.BoolVar(&c.pair, "pair", false, "run a lock-order inversion pair on the first two --locks instead")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	c.endpoints, c.locks = strings.Split(*eps, ","), strings.Split(*locks, ",")
	if *setLocks != "" {
		c.setLocks = strings.Split(*setLocks, ",")
	}
	if c.pair && len(c.locks) < 2 {
		return nil, errors.New("worker --pair needs two --locks")
	}
	c.until = time.Unix(0, *until)
	if c.register == "" || *eps == "" || *until == 0 {
		return nil, errors.New("worker needs --register, --endpoints and --until")
	}
	return &c, nil
}

// runWorker is a Go-client worker: sessions one after another, each taking
// the locks in turn (Lock, a critical section of fenced writes, Unlock)
// until an error, which ends the session (its holds end by Close or by
// expiry). It reports every call before and after it to the register.
func runWorker(ctx context.Context, c *workerConfig) error {
	if isRedis(c.backend) {
		return runRedisWorker(ctx, c)
	}
	if c.pair {
		return runPair(ctx, c)
	}
	ctx, cancel := context.WithDeadline(ctx, c.until)
	defer cancel()
	rep := newReporter(c.register, c.slot)
	cl, err := lockd.New(lockd.WithEndpoints(c.endpoints...), lockd.WithRequestTimeout(time.Second), streamOption())
	if err != nil {
		return err
	}
	defer cl.Close(context.Background())
	rng := rand.New(rand.NewPCG(c.seed, uint64(os.Getpid())))
	var opID atomic.Int64
	for done := 0; ctx.Err() == nil && done < c.maxOps; {
		sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
		s, err := cl.NewSession(sctx, lockd.WithTTL(c.ttl), lockd.WithOwner(c.slot))
		scancel()
		if err != nil {
			pause(ctx, 100*time.Millisecond)
			continue
		}
		if rep.send(ctx, Event{Kind: kindOpen, Session: s.ID()}) != nil {
			_ = s.Close(context.Background())
			return ctx.Err()
		}
		var watch sync.WaitGroup
		watch.Go(func() {
			<-s.Done()
			if errors.Is(s.Err(), lockd.ErrLeaseLost) {
				_ = rep.send(context.Background(), Event{Kind: kindLost, Session: s.ID(), Client: c.slot + ":" + s.ID()})
			}
		})
		done += c.session(ctx, rep, s, rng, &opID)
		id := opID.Add(1)
		_ = rep.send(context.Background(), Event{Kind: kindInvoke, Op: opClose, OpID: id, Session: s.ID()})
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = s.Close(cctx)
		ccancel()
		_ = rep.send(context.Background(), Event{Kind: kindReturn, Op: opClose, OpID: id, Session: s.ID(), Result: result(err)})
		watch.Wait()
	}
	return nil
}

func result(err error) string {
	if err != nil {
		return resUnknown
	}
	return resOK
}

// pause waits d or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// session runs lock operations on s until an error or the end, and
// returns how many critical sections it completed.
func (c *workerConfig) session(ctx context.Context, rep *reporter, s *lockd.Session, rng *rand.Rand, opID *atomic.Int64) int {
	n := 0
	for ctx.Err() == nil && n < c.maxOps {
		if len(c.setLocks) >= 2 && rng.IntN(3) == 0 {
			if !c.setSection(ctx, rep, s, rng, opID) {
				return n
			}
			n++
			pause(ctx, time.Duration(rng.IntN(20))*time.Millisecond)
			continue
		}
		name := c.locks[rng.IntN(len(c.locks))]
		m := s.NewMutex(name)
		id := opID.Add(1)
		if rep.send(ctx, Event{Kind: kindInvoke, Op: opAcquire, OpID: id, Session: s.ID(), Lock: name}) != nil {
			return n
		}
		lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
		err := m.Lock(lctx)
		lcancel()
		ev := Event{Kind: kindReturn, Op: opAcquire, OpID: id, Session: s.ID(), Lock: name, Result: result(err)}
		if err == nil {
			ev.Token = m.Token()
		}
		_ = rep.send(context.Background(), ev)
		if err != nil {
			return n
		}
		c.critical(ctx, rep, c.slot+":"+s.ID(), s.ID(), m, rng)
		id = opID.Add(1)
		_ = rep.send(context.Background(), Event{Kind: kindInvoke, Op: opRelease, OpID: id, Session: s.ID(), Lock: name})
		uctx, ucancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = m.Unlock(uctx)
		ucancel()
		_ = rep.send(context.Background(), Event{Kind: kindReturn, Op: opRelease, OpID: id, Session: s.ID(), Lock: name, Result: result(err)})
		if err != nil {
			return n
		}
		n++
		pause(ctx, time.Duration(rng.IntN(20))*time.Millisecond)
	}
	return n
}

// critical is the critical section: begin, a few writes, end, each fenced
// by the token. A correct worker checks its lock before every message and
// stops at the first rejection; the ignore-lease worker does neither, and
// once its lease is lost it keeps writing for another two TTLs.
func (c *workerConfig) critical(ctx context.Context, rep *reporter, client, session string, m fencedHold, rng *rand.Rand) {
	ev := Event{Kind: kindBegin, Client: client, Session: session, Lock: m.Name(), Token: m.Token()}
	writes := 2 + rng.IntN(5)
	var overtime time.Time
	for i := 0; i <= writes+1 && ctx.Err() == nil; i++ {
		switch {
		case i == writes+1:
			ev.Kind = kindEnd
		case i > 0:
			ev.Kind = kindWrite
		}
		// Stamped before the lease check: the checker tells a message
		// delayed between check and arrival (a starved process) from a
		// holder acting late.
		ev.Sent = time.Now().UnixNano()
		if c.broken == brokenIgnoreLease {
			if overtime.IsZero() && m.Err() != nil {
				overtime = time.Now().Add(2 * c.ttl)
			}
			if !overtime.IsZero() && time.Now().Before(overtime) && i == writes {
				i-- // keep writing until the overtime is up
			}
		} else if m.Err() != nil {
			return
		}
		if err := rep.send(ctx, ev); err != nil && c.broken != brokenIgnoreLease {
			return
		}
		pause(ctx, time.Duration(10+rng.IntN(20))*time.Millisecond)
	}
}

// runWrite is `chaos write`: the child of `lockd run`, a critical section
// of fenced writes with the token lockd run hands it in LOCKD_TOKEN. It
// exits 3 when the register rejects it.
func runWrite(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("chaos write", flag.ContinueOnError)
	url := fs.String("register", "", "register URL")
	slot := fs.String("slot", "r0", "client slot")
	client := fs.String("client", "", "holder identity")
	lock := fs.String("lock", "", "lock name")
	writes := fs.Int("writes", 3, "writes between begin and end")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// Redlock issues no token (LOCKD_TOKEN unset): the messages carry 0,
	// which a register in unfenced mode accepts and any other rejects.
	var tok uint64
	if v := os.Getenv("LOCKD_TOKEN"); v != "" {
		var err error
		if tok, err = strconv.ParseUint(v, 10, 64); err != nil {
			return fmt.Errorf("LOCKD_TOKEN: %w", err)
		}
	}
	rep := newReporter(*url, *slot)
	ev := Event{Kind: kindBegin, Client: *client, Session: os.Getenv("LOCKD_SESSION"), Lock: *lock, Token: tok}
	for i := 0; i <= *writes+1; i++ {
		switch {
		case i == *writes+1:
			ev.Kind = kindEnd
		case i > 0:
			ev.Kind = kindWrite
		}
		ev.Sent = 0
		if err := rep.send(ctx, ev); err != nil {
			return err
		}
		pause(ctx, 15*time.Millisecond)
	}
	return nil
}

// streamOption turns the Go clients' session stream off when
// $LOCKD_STREAM is off, 0 or false (as for the lockd command), so that a
// run under LOCKD_STREAM=off tests the unary calls: the client library
// reads no environment.
func streamOption() lockd.Option {
	switch strings.TrimSpace(os.Getenv("LOCKD_STREAM")) {
	case "off", "0", "false":
		return lockd.WithStream(false)
	}
	return lockd.WithStream(true)
}
