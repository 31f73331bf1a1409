package loadgen

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// sessionWorker is one client of the Sessions workload and the sessions
// it created.
type sessionWorker struct {
	cl       Client
	sessions []Session
	rec      *recorder
	lastAt   time.Time // when its last creation ended
	lost     int64
}

// runSessions creates cfg.Sessions sessions over cfg.Clients clients (each
// client creates its share one after another) and keeps them alive until
// the run's end. Creation latency counts over the whole run; the CPU and
// connections over the window after the warm-up, which should cover the
// creation to measure the keepalives' steady state.
func runSessions(ctx context.Context, d Driver, cfg Config, conns0 int64) (*Report, error) {
	win := newWindow(cfg)
	runCtx, cancel := context.WithDeadline(ctx, win.to)
	defer cancel()
	all := window{start: win.start, from: win.start, to: win.to}
	workers := make([]*sessionWorker, cfg.Clients)
	var wg sync.WaitGroup
	for i := range workers {
		w := &sessionWorker{rec: newRecorder(all)}
		workers[i] = w
		wg.Go(func() { w.run(runCtx, d, cfg, i) })
	}
	m := win.measure(runCtx, d, &wg)
	defer closeSessionWorkers(workers)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	recs := make([]*recorder, len(workers))
	st := &SessionStats{Requested: cfg.Sessions}
	last := win.start
	for i, w := range workers {
		recs[i] = w.rec
		st.Created += w.rec.ops
		st.Lost += w.lost
		if w.lastAt.After(last) {
			last = w.lastAt
		}
	}
	r := newReport(d, cfg, recs, m, conns0)
	for _, n := range r.Errors {
		st.CreateErrors += n
	}
	if st.Lost > 0 {
		r.Errors["session-lost"] += st.Lost
		r.ErrorCount += st.Lost
	}
	st.CreateSeconds = last.Sub(win.start).Seconds()
	r.Sessions = st
	r.Ops = st.Created
	r.OpsPerSecond = 0
	if st.CreateSeconds > 0 {
		r.OpsPerSecond = float64(st.Created) / st.CreateSeconds
	}
	return r, nil
}

// run opens the worker's client, creates sessions number i, i+Clients, ...
// and waits for the run's end, then counts the sessions it lost.
func (w *sessionWorker) run(run context.Context, d Driver, cfg Config, i int) {
	octx, cancel := context.WithTimeout(run, cfg.OpTimeout)
	cl, err := d.NewClient(octx)
	cancel()
	if err != nil {
		if run.Err() == nil {
			w.rec.fail(d.ErrorKind(err), fmt.Errorf("open client: %w", err))
		}
		return
	}
	w.cl = cl
	for j, n := i, int64(0); j < cfg.Sessions && n < cfg.MaxOps && run.Err() == nil; j, n = j+cfg.Clients, n+1 {
		start := time.Now()
		octx, cancel := context.WithTimeout(run, cfg.OpTimeout)
		s, err := cl.NewSession(octx, cfg.TTL)
		cancel()
		if err != nil {
			if run.Err() != nil {
				break
			}
			w.rec.fail(d.ErrorKind(err), err)
			continue
		}
		w.lastAt = time.Now()
		w.rec.op(start, w.lastAt)
		w.sessions = append(w.sessions, s)
	}
	<-run.Done()
	for _, s := range w.sessions {
		select {
		case <-s.Done():
			w.lost++
		default:
		}
	}
}

// closeSessionWorkers closes every session, each client's one at a time
// (closing thousands at once would open as many connections), then the
// clients, bounded by cleanupTimeout; sessions left open expire by TTL.
func closeSessionWorkers(workers []*sessionWorker) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, w := range workers {
		if w.cl == nil {
			continue
		}
		wg.Go(func() {
			for _, s := range w.sessions {
				if ctx.Err() != nil {
					break
				}
				_ = s.Close(ctx)
			}
			_ = w.cl.Close(ctx)
		})
	}
	wg.Wait()
}
