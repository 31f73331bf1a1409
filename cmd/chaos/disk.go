package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// injectDisk runs a node-disk-slow or node-disk-hang fault through the
// node's disk delay file (internal/diskfault: the node's Raft log and
// stable store writes wait for what the file says).
//
// node-disk-slow delays every write of a random node by 100–400 ms for
// TTL + grace + 1 s. node-disk-hang blocks every write of the leader:
// hashicorp/raft keeps heartbeating, so only the server's watchdog can
// hand leadership on, by exiting once a proposal has waited longer than
// its limit. The hang lasts until the node exits or for the limit plus
// 3 s; then the file is cleared and a node that exited is restarted on its
// data dir, as after a kill. The heal event says whether the watchdog
// fired.
func (m *nemesis) injectDisk(ctx context.Context, kind string, id int64) (bool, error) {
	t := m.t
	if kind == faultDiskSlow {
		n := m.c.nodes[m.rng.IntN(len(m.c.nodes))]
		delay := time.Duration(100+m.rng.IntN(301)) * time.Millisecond
		d := t.TTL + t.Grace + time.Second
		m.record(kindFault, kind, n.id, fmt.Sprintf("every disk write %v late for %v", delay, d), id)
		err := os.WriteFile(n.disk, []byte(delay.String()), 0o600)
		sleep(ctx, d)
		if rerr := os.Remove(n.disk); err == nil && !errors.Is(rerr, os.ErrNotExist) {
			err = rerr
		}
		m.record(kindHeal, kind, n.id, "disk back to full speed", id)
		if err != nil {
			return true, fmt.Errorf("slow disk of %s: %w", n.id, err)
		}
		return true, nil
	}
	n := m.c.leader(ctx)
	if n == nil {
		return false, nil
	}
	limit := t.Watchdog + 3*time.Second
	var logAt int64 // the node's log grows across restarts: read only what this fault adds
	if fi, err := os.Stat(n.log); err == nil {
		logAt = fi.Size()
	}
	m.record(kindFault, kind, n.id, fmt.Sprintf("disk hangs (leader; watchdog limit %v) for up to %v", t.Watchdog, limit), id)
	err := os.WriteFile(n.disk, []byte("hang"), 0o600)
	exited := false
	if err == nil {
		timer := time.NewTimer(limit)
		select {
		case <-n.done():
			exited = true
		case <-timer.C:
		case <-ctx.Done():
		}
		timer.Stop()
	}
	if rerr := os.Remove(n.disk); err == nil && !errors.Is(rerr, os.ErrNotExist) {
		err = rerr
	}
	if err != nil {
		return true, fmt.Errorf("hung disk of %s: %w", n.id, err)
	}
	if !exited {
		// Leadership can move between reading the leader and writing
		// its file (a fault just before): a follower's hung disk stalls
		// nobody, and no watchdog need fire.
		detail := "disk back; the watchdog did not fire"
		if cur := m.c.leader(ctx); cur != nil && cur != n {
			detail += "; not the leader (" + cur.id + " is)"
		}
		m.record(kindHeal, kind, n.id, detail, id)
		m.log("%s of %s: the watchdog did not fire within %v", kind, n.id, limit)
		return true, nil
	}
	why := "exited"
	if b, rerr := os.ReadFile(n.log); rerr == nil && int64(len(b)) >= logAt && strings.Contains(string(b[logAt:]), "leader watchdog") {
		why = "watchdog fired, the node exited"
	}
	// Restarted like a killed node: the exit is the fault working.
	if err := m.c.start(ctx, n); err != nil {
		return true, fmt.Errorf("restart %s after its disk hung: %w", n.id, err)
	}
	m.record(kindHeal, kind, n.id, why+"; disk back, restarted", id)
	m.log("%s of %s: %s; restarted", kind, n.id, why)
	return true, nil
}
