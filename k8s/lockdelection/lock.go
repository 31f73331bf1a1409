// Package lockdelection is a client-go leader-election lock
// (resourcelock.Interface) backed by a lockd election: a controller keeps
// its leaderelection.RunOrDie code and gets lockd's failover (the next
// candidate is granted leadership as soon as the leader's session lease
// runs out, about TTL + grace after a crash) and a fencing token for the
// writes it makes as leader.
//
// lockd, not the lease timestamps, decides who leads: Get reports the
// lockd holder with a zero lease duration, so client-go's elector always
// goes on to Create or Update, which wait in lockd's FIFO queue until this
// candidate is granted the lock. LeaseDuration, RenewDeadline and
// RetryPeriod still pace the elector's renew loop; a leader whose lockd
// lease is lost fails its next renewal at once and stops leading.
package lockdelection

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/lockd-dev/lockd"
)

// Config configures a Lock.
type Config struct {
	// Client is the lockd client the Lock uses; the caller closes it.
	Client *lockd.Client
	// Name is the lockd election (lock) name, e.g. "k8s/kube-system/my-controller".
	Name string
	// Identity names this candidate (leaderelection's Identity; shown as
	// the holder). Must be unique among the candidates.
	Identity string
	// TTL is the lockd session TTL: a crashed leader is replaced about
	// TTL + the server's grace after its last keepalive. Default 2 s.
	TTL time.Duration
}

// Lock is a resourcelock.Interface backed by a lockd election. It is safe
// for the concurrent use the leader elector makes of it.
type Lock struct {
	cfg Config

	mu      sync.Mutex
	session *lockd.Session
	elec    *lockd.Election
	leading bool                              // the elector was told it leads
	lost    bool                              // it led and lost it: never campaigns again
	record  resourcelock.LeaderElectionRecord // this candidate's record while leading
}

// gr is the group/resource named in NotFound errors (client-go only checks
// the reason).
var gr = schema.GroupResource{Group: "lockd.dev", Resource: "elections"}

// New returns a Lock. Nothing is sent until the elector calls it.
func New(cfg Config) (*Lock, error) {
	if cfg.Client == nil || cfg.Name == "" || cfg.Identity == "" {
		return nil, errors.New("lockdelection: Client, Name and Identity are required")
	}
	if cfg.TTL == 0 {
		cfg.TTL = 2 * time.Second
	}
	return &Lock{cfg: cfg}, nil
}

// holderValue is what a candidate announces in lockd (shown by Leader).
type holderValue struct {
	Identity string `json:"identity"`
}

// Get returns the current leader's record. When this candidate leads it is
// its own last record; otherwise lockd's holder with LeaseDurationSeconds
// 0, so the elector does not wait out a lease of its own but asks lockd
// (Update), which queues the candidate. No holder: NotFound (Create).
func (l *Lock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	l.mu.Lock()
	if l.leading && l.elec.Err() == nil {
		r := l.record
		l.mu.Unlock()
		return l.encode(&r)
	}
	l.mu.Unlock()
	s, err := l.ensureSession(ctx)
	if err != nil {
		return nil, nil, err
	}
	ld, err := s.NewElection(l.cfg.Name).Leader(ctx)
	if errors.Is(err, lockd.ErrNoLeader) {
		return nil, nil, apierrors.NewNotFound(gr, l.cfg.Name)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("lockdelection: get leader: %w", err)
	}
	var v holderValue
	_ = json.Unmarshal(ld.Value, &v) // a holder that is not a Lock shows as its owner
	if v.Identity == "" {
		v.Identity = ld.Owner
	}
	return l.encode(&resourcelock.LeaderElectionRecord{HolderIdentity: v.Identity, LeaseDurationSeconds: 0})
}

func (l *Lock) encode(r *resourcelock.LeaderElectionRecord) (*resourcelock.LeaderElectionRecord, []byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, nil, fmt.Errorf("lockdelection: encode record: %w", err)
	}
	return r, b, nil
}

// Create campaigns (the elector saw no leader).
func (l *Lock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return l.Update(ctx, ler)
}

// Update renews this candidate's leadership, or waits in lockd's queue
// until it is granted (or ctx ends), or resigns when ler names no holder
// (the elector's ReleaseOnCancel).
func (l *Lock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	l.mu.Lock()
	if ler.HolderIdentity == "" {
		defer l.mu.Unlock()
		if !l.leading {
			return nil
		}
		l.leading, l.lost = false, true
		if err := l.elec.Resign(ctx); err != nil && !errors.Is(err, lockd.ErrNotHeld) {
			return fmt.Errorf("lockdelection: resign: %w", err)
		}
		return nil
	}
	if ler.HolderIdentity != l.cfg.Identity {
		l.mu.Unlock()
		return fmt.Errorf("lockdelection: record names %q, this lock is %q", ler.HolderIdentity, l.cfg.Identity)
	}
	if l.lost {
		l.mu.Unlock()
		return fmt.Errorf("lockdelection: leadership of %q was lost; this Lock does not campaign again (start a new elector with a new Lock)", l.cfg.Name)
	}
	if l.leading {
		defer l.mu.Unlock()
		if err := l.elec.Err(); err != nil {
			// Leadership ended in lockd (the lease ran out): the renewal
			// fails and the elector stops leading. The token is stale, so
			// this Lock never campaigns again: a renewal that re-campaigned
			// would make the elector lead on, unaware that its token changed.
			l.leading, l.lost = false, true
			return fmt.Errorf("lockdelection: leadership of %q lost: %w", l.cfg.Name, err)
		}
		l.record = ler
		return nil
	}
	s, err := l.ensureSessionLocked(ctx)
	l.mu.Unlock()
	if err != nil {
		return err
	}
	val, _ := json.Marshal(holderValue{Identity: l.cfg.Identity})
	e := s.NewElection(l.cfg.Name)
	// Wait in lockd's queue without holding mu (Fence stays callable).
	if err := e.Campaign(ctx, val); err != nil {
		return fmt.Errorf("lockdelection: campaign %q: %w", l.cfg.Name, err)
	}
	l.mu.Lock()
	l.elec, l.leading, l.record = e, true, ler
	l.mu.Unlock()
	return nil
}

// ensureSession returns a live session, opening a new one if the last was
// lost.
func (l *Lock) ensureSession(ctx context.Context) (*lockd.Session, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ensureSessionLocked(ctx)
}

func (l *Lock) ensureSessionLocked(ctx context.Context) (*lockd.Session, error) {
	if l.session != nil && l.session.Err() == nil {
		return l.session, nil
	}
	s, err := l.cfg.Client.NewSession(ctx, lockd.WithTTL(l.cfg.TTL), lockd.WithOwner(l.cfg.Identity))
	if err != nil {
		return nil, fmt.Errorf("lockdelection: open session: %w", err)
	}
	l.session = s
	return s, nil
}

// RecordEvent does nothing: lockd keeps the history (grants, expiries)
// itself (lockd watch).
func (l *Lock) RecordEvent(string) {}

// Identity returns this candidate's identity.
func (l *Lock) Identity() string { return l.cfg.Identity }

// Describe names the lock in the elector's logs.
func (l *Lock) Describe() string { return "lockd/" + l.cfg.Name }

// Fence returns the fencing token of this candidate's leadership and a
// context that ends when lockd ends it (lease lost or resigned); token 0
// and a done context when it does not lead. Call it in OnStartedLeading and
// pass the token with every write the leader makes.
func (l *Lock) Fence() (uint64, context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.elec == nil || !l.leading {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return 0, ctx
	}
	return l.elec.Token(), l.elec.Context()
}

// Close resigns if leading and closes the lockd session.
func (l *Lock) Close(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leading = false
	if l.session == nil {
		return nil
	}
	return l.session.Close(ctx)
}

var _ resourcelock.Interface = (*Lock)(nil)
