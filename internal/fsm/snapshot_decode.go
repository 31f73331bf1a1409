package fsm

import (
	"fmt"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// A restore (a restart, or a snapshot installed from the leader) decodes the
// snapshot's locks one at a time into one reused message and builds each
// lock from it, instead of unmarshalling the whole snapshot into messages
// first: for 1 000 000 locks those were about 180 MB alive at once beside
// the state being built, and the restart's peak. Everything but the locks
// (fields 1 to 4, 6 and 7: sessions, members, counters) is unmarshalled as
// before; the checks are decodeState's own.

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
	var pl fsmv1.Lock
	size := func(sessions map[string]*session) { sizeHoldsBytes(b, sessions) }
	st, err := decodeStateLocks(&head, n, size, func(yield func(*fsmv1.Lock) error) error {
		for p := b; len(p) > 0; {
			num, typ, tl := protowire.ConsumeTag(p)
			vl := protowire.ConsumeFieldValue(num, typ, p[tl:])
			if num == snapshotFieldLocks && typ == protowire.BytesType {
				v, _ := protowire.ConsumeBytes(p[tl:])
				if err := proto.Unmarshal(v, &pl); err != nil {
					return fmt.Errorf("decode snapshot: %w", err)
				}
				if err := yield(&pl); err != nil {
					return err
				}
			}
			p = p[tl+vl:]
		}
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	return st, head.AppliedIndex, nil
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
