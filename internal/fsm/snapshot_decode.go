package fsm

import (
	"fmt"
	"slices"

	"github.com/google/btree"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/codec"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// A restore (a restart, or a snapshot installed from the leader) decodes the
// snapshot's locks a batch at a time into reused messages and builds each
// lock from them, instead of unmarshalling the whole snapshot into messages
// first: for 1 000 000 locks those were about 180 MB alive at once beside
// the state being built, and the restart's peak. Everything but the locks
// (fields 1 to 4, 6 and 7: sessions, members, counters) is unmarshalled as
// before; the checks are decodeState's own. Three goroutines share the
// work: one unmarshals (unmarshalLocksAhead), one builds and checks the
// locks (decodeStateLocks), one indexes them (indexing); a restore of
// 1 000 000 locks took 3.8-4.4 s on one core and takes 2.2-2.9 s on two
// (BenchmarkRestore1M).

// decodeSnapshotBytes checks and decodes an encoded snapshot (the version
// byte first) into a state and its applied index, lock by lock.
func decodeSnapshotBytes(b []byte) (*state, uint64, error) {
	if len(b) == 0 || b[0] != snapshotVersion {
		return nil, 0, fmt.Errorf("unknown snapshot format")
	}
	b = b[1:]
	// First pass: the fields that are not locks, copied out, and the
	// locks counted. A field number of 5 with another wire type is left
	// to proto.Unmarshal, as a whole-message unmarshal would.
	var rest []byte
	n := 0
	for p := b; len(p) > 0; {
		num, typ, tl := protowire.ConsumeTag(p)
		if tl < 0 {
			return nil, 0, fmt.Errorf("decode snapshot: %w", protowire.ParseError(tl))
		}
		vl := protowire.ConsumeFieldValue(num, typ, p[tl:])
		if vl < 0 {
			return nil, 0, fmt.Errorf("decode snapshot: %w", protowire.ParseError(vl))
		}
		if num == snapshotFieldLocks && typ == protowire.BytesType {
			n++
		} else {
			rest = append(rest, p[:tl+vl]...)
		}
		p = p[tl+vl:]
	}
	var head fsmv1.Snapshot
	if err := proto.Unmarshal(rest, &head); err != nil {
		return nil, 0, fmt.Errorf("decode snapshot: %w", err)
	}
	size := func(sessions map[string]*session) { sizeHoldsBytes(b, sessions) }
	st, err := decodeStateLocks(&head, n, size, func(yield func(*fsmv1.Lock) error) error {
		return unmarshalLocksAhead(b, yield)
	})
	if err != nil {
		return nil, 0, err
	}
	return st, head.AppliedIndex, nil
}

// A restore unmarshals the locks on a goroutine of its own, a batch ahead of
// the one building the state from them: unmarshalling is about a third of
// a restore's work, and a restart of a node with 1 000 000 locks was
// bound by one core while the other sat mostly idle.
const (
	aheadBatch   = 256 // locks per batch
	aheadBatches = 4   // batches in flight
)

// lockBatch is a batch of unmarshalled locks, and the error that ended the
// unmarshalling after them, if any.
type lockBatch struct {
	locks []fsmv1.Lock
	n     int
	err   error
}

// unmarshalLocksAhead unmarshals the locks of an encoded snapshot (without
// its version byte, already parsed once) and yields each in order, as
// decodeStateLocks asks: it stops at the first error, yield's or
// proto.Unmarshal's, and returns it, exactly as one loop doing both in turn
// would. A message yielded is reused once yield returns. The unmarshalling
// goroutine has ended when it returns.
func unmarshalLocksAhead(b []byte, yield func(*fsmv1.Lock) error) error {
	full := make(chan *lockBatch, aheadBatches) // never blocks: aheadBatches exist
	free := make(chan *lockBatch, aheadBatches)
	for range aheadBatches {
		free <- &lockBatch{locks: make([]fsmv1.Lock, aheadBatch)}
	}
	stop := make(chan struct{})
	go func() {
		defer close(full)
		for p := b; len(p) > 0; {
			var lb *lockBatch
			select {
			case lb = <-free:
			case <-stop:
				return
			}
			lb.n, lb.err = 0, nil
			for lb.n < len(lb.locks) && len(p) > 0 && lb.err == nil {
				num, typ, tl := protowire.ConsumeTag(p)
				vl := protowire.ConsumeFieldValue(num, typ, p[tl:])
				if num == snapshotFieldLocks && typ == protowire.BytesType {
					v, _ := protowire.ConsumeBytes(p[tl:])
					if err := codec.UnmarshalExact(v, &lb.locks[lb.n]); err != nil {
						lb.err = fmt.Errorf("decode snapshot: %w", err)
					} else {
						lb.n++
					}
				}
				p = p[tl+vl:]
			}
			full <- lb
			if lb.err != nil {
				return
			}
		}
	}()
	defer func() {
		close(stop)
		for range full { // until the goroutine has ended
		}
	}()
	for lb := range full {
		for i := range lb.n {
			if err := yield(&lb.locks[i]); err != nil {
				return err
			}
		}
		if lb.err != nil {
			return lb.err
		}
		free <- lb
	}
	return nil
}

// sizeHoldsBytes is sizeHolds on an encoded snapshot (without its version
// byte, already parsed once): it reads only the holders' session ids.
func sizeHoldsBytes(b []byte, sessions map[string]*session) {
	holds := make(map[*session]int, len(sessions))
	each := func(b []byte, field protowire.Number, f func(v []byte)) {
		for len(b) > 0 {
			num, typ, tl := protowire.ConsumeTag(b)
			if tl < 0 {
				return
			}
			vl := protowire.ConsumeFieldValue(num, typ, b[tl:])
			if vl < 0 {
				return
			}
			if num == field && typ == protowire.BytesType {
				v, _ := protowire.ConsumeBytes(b[tl:])
				f(v)
			}
			b = b[tl+vl:]
		}
	}
	const lockHolders, holdSession = 3, 1 // fsmv1.Lock.holders, fsmv1.Hold.session_id
	each(b, snapshotFieldLocks, func(lock []byte) {
		each(lock, lockHolders, func(hold []byte) {
			each(hold, holdSession, func(id []byte) {
				if s := sessions[string(id)]; s != nil {
					holds[s]++
				}
			})
		})
	})
	for s, n := range holds {
		s.holds = make(map[string]*hold, n)
	}
}

// has reports whether session s (id) already holds or waits for l, while
// l is being decoded. Lock names are unique by then, so only l's own
// holders and waiters can clash: a short lock is scanned instead of
// looking its name up in the session's maps.
func (l *lock) has(s *session, id string) bool {
	if len(l.holders)+len(l.queue) > 8 {
		return s.holds[l.name] != nil || s.waits[l.name] != nil
	}
	for _, h := range l.holders {
		if h.session == id {
			return true
		}
	}
	for _, w := range l.queue {
		if w.session == id {
			return true
		}
	}
	return false
}

// decodeMembers builds the member table of a snapshot.
func decodeMembers(pms []*fsmv1.MemberInfo) (map[string]Member, error) {
	members := map[string]Member{}
	for _, m := range pms {
		if m.NodeId == "" {
			return nil, fmt.Errorf("snapshot: member without id")
		}
		members[m.NodeId] = Member{ID: m.NodeId, API: m.ApiUrl, Raft: m.RaftAddress, NonVoter: m.NonVoter}
	}
	return members, nil
}

// checkTokensOnce refuses a snapshot in which two holds have one token. It
// sorts the tokens (decodeLock collects them) and compares neighbours: a
// map of a million tokens cost a cache miss per hold, 0.5 s of a restore.
func checkTokensOnce(tokens []uint64) error {
	slices.Sort(tokens)
	for i := 1; i < len(tokens); i++ {
		if tokens[i] == tokens[i-1] {
			return fmt.Errorf("snapshot: bad or repeated token %d: held twice", tokens[i])
		}
	}
	return nil
}

// indexing adds the locks of a restore to the name map and the name index
// on a goroutine of its own: the inserts, a cache miss or more each, were
// a third of what the goroutine building the locks did.
type indexing struct {
	batch []*lock
	ch    chan []*lock
	done  chan struct{}
}

func startIndexing(byName map[string]*lock, names *btree.BTreeG[*lock]) *indexing {
	ch, done := make(chan []*lock, aheadBatches), make(chan struct{})
	go func() {
		defer close(done)
		for b := range ch {
			for _, l := range b {
				byName[l.name] = l
				names.ReplaceOrInsert(l)
			}
		}
	}()
	return &indexing{ch: ch, done: done}
}

// add queues l; its name is not in the maps yet.
func (x *indexing) add(l *lock) {
	if x.batch == nil {
		x.batch = make([]*lock, 0, aheadBatch)
	}
	x.batch = append(x.batch, l)
	if len(x.batch) == aheadBatch {
		x.ch <- x.batch
		x.batch = nil
	}
}

// wait returns once every lock added is in the maps, which are then the
// caller's again; add must not be called after it. It may be called again.
func (x *indexing) wait() {
	if x.ch == nil {
		return
	}
	if len(x.batch) > 0 {
		x.ch <- x.batch
	}
	close(x.ch)
	x.ch, x.batch = nil, nil
	<-x.done
}
