package main

import (
	"context"
	"fmt"
	"time"
)

// target is what a run attacks: a lockd cluster, or the Redis servers of a
// Redis backend. Exactly one of c and rf is set.
type target struct {
	c  *cluster
	rf *redisFleet
}

// newTarget lays out and starts the backend's processes. On error the
// returned target (if any) still needs down.
func newTarget(ctx context.Context, cfg *config, bin, work string, t timing) (*target, error) {
	if isRedis(cfg.Backend) {
		rf, err := newRedisFleet(cfg.Backend, work)
		if err != nil {
			return nil, err
		}
		tg := &target{rf: rf}
		return tg, rf.up(ctx)
	}
	c, err := newCluster(bin, work, cfg.Nodes, t)
	if err != nil {
		return nil, err
	}
	tg := &target{c: c}
	return tg, c.up(ctx)
}

func (tg *target) down() {
	if tg.c != nil {
		tg.c.down()
	} else {
		tg.rf.down()
	}
}

func (tg *target) describe() string {
	if tg.c != nil {
		return fmt.Sprintf("cluster of %d", len(tg.c.nodes))
	}
	return fmt.Sprintf("%d redis-server(s) at %v", len(tg.rf.servers), tg.rf.addrs())
}

// nodes is the number of lockd nodes or Redis servers.
func (tg *target) nodes() int {
	if tg.c != nil {
		return len(tg.c.nodes)
	}
	return len(tg.rf.servers)
}

// waitStable waits until the target is whole again after a fault.
func (tg *target) waitStable(ctx context.Context, timeout time.Duration) error {
	if tg.c != nil {
		return tg.c.waitStable(ctx, timeout)
	}
	return tg.rf.waitUp(ctx, timeout)
}

// probe takes and releases every lock with a fresh client.
func (tg *target) probe(ctx context.Context, locks []string, bound time.Duration) error {
	if tg.c != nil {
		return probeLocks(ctx, tg.c, locks, bound)
	}
	return probeRedis(ctx, tg.rf, locks, defaultTiming.TTL, bound)
}
