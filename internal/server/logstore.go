package server

import (
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// countingLogStore counts the batches and entries written to the Raft log.
// Each StoreLogs call is one write and one fsync, so entries per batch is
// the group-commit factor (lockd_raft_log_entries_total /
// lockd_raft_log_batches_total).
type countingLogStore struct {
	raft.LogStore
	batches, entries prometheus.Counter
}

func newCountingLogStore(ls raft.LogStore, reg prometheus.Registerer) *countingLogStore {
	c := &countingLogStore{
		LogStore: ls,
		batches:  prometheus.NewCounter(prometheus.CounterOpts{Name: "lockd_raft_log_batches_total", Help: "Batches written (and fsynced) to the Raft log."}),
		entries:  prometheus.NewCounter(prometheus.CounterOpts{Name: "lockd_raft_log_entries_total", Help: "Entries written to the Raft log."}),
	}
	reg.MustRegister(c.batches, c.entries)
	return c
}

func (c *countingLogStore) StoreLog(l *raft.Log) error {
	return c.StoreLogs([]*raft.Log{l})
}

func (c *countingLogStore) StoreLogs(logs []*raft.Log) error {
	if err := c.LogStore.StoreLogs(logs); err != nil {
		return err
	}
	c.batches.Inc()
	c.entries.Add(float64(len(logs)))
	return nil
}

// IsMonotonic passes on the wrapped store's raft.MonotonicLogStore answer.
// Without it, hashicorp/raft would treat raft-wal as non-monotonic and keep
// a follower's old log after installing a snapshot, which raft-wal then
// refuses to append to: the follower would never catch up.
func (c *countingLogStore) IsMonotonic() bool {
	m, ok := c.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}
