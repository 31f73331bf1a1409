package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/redislock"
)

// Backends the tool attacks. The Redis ones run the same clients (Go
// workers on package redislock, `lockd run --backend redis://…` loops)
// against redis-server processes the tool starts; their violations are the
// measured outcome of the run, not a failure of the tool (see exitFor).
const (
	backendLockd    = "lockd"
	backendRedis    = "redis"     // one redis-server, no persistence
	backendRedisAOF = "redis-aof" // one redis-server, appendonly yes, appendfsync always
	backendRedlock  = "redlock"   // three redis-servers without persistence, Redlock
)

// Redis fault kinds.
const (
	faultRedisKill  = "redis-kill"  // kill -9 one redis-server, restart it within 0.1 s on the same dir
	faultRedisPause = "redis-pause" // SIGSTOP one redis-server for TTL + 1 s, then SIGCONT
)

// redisFaults is every kind the tool injects on a Redis backend, each once
// in the short profile, except kills: four, as a kill breaks a lock only
// when a holder is inside its critical section across the restart.
var redisFaults = []string{
	faultRedisKill, faultRedisKill, faultRedisKill, faultRedisKill, faultRedisPause,
	faultClientPauseGo, faultClientPauseRn, faultClientKillGo, faultClientKillRn,
}

// redisServer is one redis-server process; its port and dir stay across
// restarts.
type redisServer struct {
	id, addr, dir, log string
	aof                bool
	proc               // the running redis-server
}

// redisFleet is the Redis side of a run: one server, or three for Redlock.
type redisFleet struct {
	bin     string
	servers []*redisServer
}

// newRedisFleet lays out the servers of the backend without starting them.
// Without redis-server on PATH it fails with errNoRedis.
func newRedisFleet(backend, dir string) (*redisFleet, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNoRedis, err)
	}
	n := 1
	if backend == backendRedlock {
		n = 3
	}
	f := &redisFleet{bin: bin}
	for i := range n {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		id := fmt.Sprintf("redis%d", i+1)
		d := filepath.Join(dir, id)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		f.servers = append(f.servers, &redisServer{id: id, addr: addr, dir: d, log: filepath.Join(dir, id+".log"), aof: backend == backendRedisAOF})
	}
	return f, nil
}

// errNoRedis: redis-server is not installed.
var errNoRedis = errors.New("redis-server not found")

// start starts (or restarts) the server and waits until it answers PING.
// Without AOF it comes back empty: every lock key and token counter lost.
func (f *redisFleet) start(ctx context.Context, s *redisServer) error {
	host, port, _ := net.SplitHostPort(s.addr)
	args := []string{"--port", port, "--bind", host, "--save", "", "--dir", s.dir,
		"--daemonize", "no", "--loglevel", "warning", "--logfile", ""}
	if s.aof {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(f.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	exited, err := s.start(cmd)
	if err != nil {
		return err
	}
	return poll(ctx, 20*time.Second, 20*time.Millisecond, func() (bool, error) {
		select {
		case <-exited:
			b, _ := os.ReadFile(s.log)
			return false, fmt.Errorf("%s exited: %s", s.id, lastLines(string(b), 5))
		default:
		}
		return s.ping(ctx) == nil, nil
	})
}

// ping sends one PING on a fresh connection.
func (s *redisServer) ping(ctx context.Context) error {
	c := redis.NewClient(&redis.Options{Addr: s.addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	return c.Ping(ctx).Err()
}

// up starts every server.
func (f *redisFleet) up(ctx context.Context) error {
	for _, s := range f.servers {
		if err := f.start(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

// down kills every server.
func (f *redisFleet) down() {
	for _, s := range f.servers {
		s.kill()
	}
}

// waitUp waits until every server answers PING.
func (f *redisFleet) waitUp(ctx context.Context, timeout time.Duration) error {
	for _, s := range f.servers {
		if err := poll(ctx, timeout, 50*time.Millisecond, func() (bool, error) { return s.ping(ctx) == nil, nil }); err != nil {
			return fmt.Errorf("%s not answering: %w", s.id, err)
		}
	}
	return nil
}

// addrs lists the servers' host:port.
func (f *redisFleet) addrs() []string {
	var out []string
	for _, s := range f.servers {
		out = append(out, s.addr)
	}
	return out
}

// urls lists the servers as redis:// URLs, for `lockd run --backend`.
func (f *redisFleet) urls() []string {
	var out []string
	for _, a := range f.addrs() {
		out = append(out, "redis://"+a)
	}
	return out
}

// redisBackend connects to addrs (one: a single instance, several:
// Redlock) with lock TTL ttl. close closes the backend and its clients.
func redisBackend(ctx context.Context, addrs []string, ttl time.Duration) (b lockd.Backend, close func(), err error) {
	var clients []redis.UniversalClient
	for _, a := range addrs {
		clients = append(clients, redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true,
			DialTimeout: 500 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second, MaxRetries: -1}))
	}
	closeAll := func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}
	opts := []redislock.Option{redislock.WithTTL(ttl), redislock.WithLogger(discardLogger)}
	var closeB func(context.Context) error
	if len(clients) == 1 {
		var c *redislock.Client
		if c, err = redislock.New(ctx, clients[0], opts...); err == nil {
			b, closeB = c.Backend(), c.Close
		}
	} else {
		var r *redislock.Redlock
		if r, err = redislock.NewRedlock(ctx, clients, opts...); err == nil {
			b, closeB = r.Backend(), r.Close
		}
	}
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return b, func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = closeB(cctx)
		cancel()
		closeAll()
	}, nil
}

// probeRedis takes and releases every lock once the clients stopped: a
// lock not granted within bound is a liveness violation.
func probeRedis(ctx context.Context, f *redisFleet, locks []string, ttl, bound time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	b, closeB, err := redisBackend(ctx, f.addrs(), ttl)
	if err != nil {
		return fmt.Errorf("liveness probe: %w", err)
	}
	defer closeB()
	for _, name := range locks {
		m := b.NewMutex(name)
		if err := m.Lock(ctx); err != nil {
			return fmt.Errorf("liveness probe: lock %q not granted within %v after the clients stopped: %w", name, bound, err)
		}
		if err := m.Unlock(ctx); err != nil {
			return fmt.Errorf("liveness probe: unlock %q: %w", name, err)
		}
	}
	return nil
}

// injectRedis runs one Redis fault from injection to heal.
func (m *nemesis) injectRedis(ctx context.Context, kind string, id int64) error {
	t := m.t
	s := m.rf.servers[m.rng.IntN(len(m.rf.servers))]
	switch kind {
	case faultRedisKill:
		detail := "kill -9, restart without persistence (data lost)"
		if s.aof {
			detail = "kill -9, restart from the AOF (appendfsync always)"
		}
		m.record(kindFault, kind, s.id, detail, id)
		s.kill()
		// Restarted at once, as a supervisor would: a holder that is in
		// its critical section across the restart overlaps with the next
		// grant when the data is gone.
		sleep(ctx, time.Duration(m.rng.IntN(100))*time.Millisecond)
		if err := m.rf.start(ctx, s); err != nil {
			return fmt.Errorf("restart %s: %w", s.id, err)
		}
		m.record(kindHeal, kind, s.id, "restarted", id)
	case faultRedisPause:
		d := t.TTL + time.Second
		m.record(kindFault, kind, s.id, "SIGSTOP "+d.String(), id)
		s.signal(syscall.SIGSTOP)
		sleep(ctx, d)
		s.signal(syscall.SIGCONT)
		m.record(kindHeal, kind, s.id, "SIGCONT", id)
	}
	return nil
}

// isRedis reports whether backend is one of the Redis backends.
func isRedis(backend string) bool {
	return backend == backendRedis || backend == backendRedisAOF || backend == backendRedlock
}

// discardLogger silences redislock's logs in the workers.
var discardLogger = slog.New(slog.DiscardHandler)
