package fsm

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"slices"

	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// The duplicate table (Raft dissertation §6.3): per session, the answers of
// requests at or above the session's acknowledged floor, each with the
// fingerprint of the request it answers. See DESIGN.md.

// fingerprint identifies what a request asks, so a seq reused for another
// request is refused instead of answered with the first one's result. It is
// a 64-bit FNV-1a hash of the command type and the fields that make the
// request what it is; 0 means "unknown" (an answer from an older snapshot)
// and matches any repeat.
type fingerprint uint64

// kindCancelledAcquire fingerprints the answer a Cancel stores for an
// acquire it overtook: it knows the acquire's lock, not its mode or limit.
const kindCancelledAcquire = 0xff

func fingerprintOf(kind byte, name string, nums ...uint64) fingerprint {
	h := fnv.New64a()
	var b [8]byte
	h.Write([]byte{kind})
	binary.BigEndian.PutUint64(b[:], uint64(len(name)))
	h.Write(b[:])
	h.Write([]byte(name))
	for _, n := range nums {
		binary.BigEndian.PutUint64(b[:], n)
		h.Write(b[:])
	}
	if v := h.Sum64(); v != 0 {
		return fingerprint(v)
	}
	return 1
}

func acquireFingerprint(c *fsmv1.Acquire) fingerprint {
	limit := uint64(1) << 32 // absent
	if c.Limit != nil {
		limit = uint64(*c.Limit)
	}
	return fingerprintOf(byte(CmdAcquire), c.Name, uint64(uint32(c.Mode)), limit)
}

func releaseFingerprint(c *fsmv1.Release) fingerprint {
	return fingerprintOf(byte(CmdRelease), c.Name, c.Token)
}

func cancelFingerprint(c *fsmv1.Cancel) fingerprint {
	return fingerprintOf(byte(CmdCancel), c.Name, c.AcquireSeq)
}

func completeFingerprint(c *fsmv1.Complete) fingerprint {
	return fingerprintOf(byte(CmdComplete), c.Name, c.Token, uint64(c.RetentionMs))
}

func cancelledAcquireFingerprint(name string) fingerprint {
	return fingerprintOf(kindCancelledAcquire, name)
}

// request runs the duplicate check shared by acquire, release, cancel and
// complete. fp is the request's fingerprint and also one more fingerprint it
// matches (0 for none). It returns the session, or a result to answer with
// at once.
func (f *FSM) request(id string, seq, ack uint64, fp, also fingerprint) (*session, *Result) {
	s := f.sessions[id]
	if s == nil {
		return nil, fail(CodeSessionUnknown, "session %s not found (expired or closed)", id)
	}
	if seq == 0 {
		return nil, fail(CodeInvalid, "request seq must be positive")
	}
	if r, ok := s.results[seq]; ok {
		if got := fingerprint(r.Fingerprint); got != 0 && got != fp && (also == 0 || got != also) {
			// Not remembered: the first request keeps its answer.
			return nil, fail(CodeInvalid, "request seq %d was already used by a different request of this session (each request needs a new seq)", seq)
		}
		return nil, &Result{Code: Code(r.Code), Msg: dupMsg(Code(r.Code)), Status: statusOf(r), Token: r.Token, Position: r.Position, Released: r.Flag, Duplicate: true}
	}
	if seq < s.ack {
		return nil, fail(CodeInvalid, "request seq %d is below %d: already answered and acknowledged, or too old to tell", seq, s.ack)
	}
	if ack > s.ack && ack <= seq {
		s.forgetBelow(ack)
	}
	return s, nil
}

func statusOf(r *fsmv1.Result) int {
	if r.Code != int32(OK) || r.Token == 0 && r.Position == 0 {
		return 0
	}
	if r.Token != 0 {
		return StatusGranted
	}
	return StatusQueued
}

func dupMsg(c Code) string {
	if c == OK {
		return ""
	}
	return fmt.Sprintf("request refused earlier (code %d)", c)
}

// remember stores a request's answer in the session's duplicate table.
func (f *FSM) remember(s *session, seq uint64, fp fingerprint, r *Result) *Result {
	s.store(&fsmv1.Result{Seq: seq, Code: int32(r.Code), Token: r.Token, Position: r.Position, Flag: r.Released, Fingerprint: uint64(fp)})
	return r
}

// forgetBelow drops the answers the client has acknowledged (seq < ack) and
// raises the floor to ack. It touches only the dropped answers.
func (s *session) forgetBelow(ack uint64) {
	i, _ := slices.BinarySearch(s.seqs, ack)
	for _, seq := range s.seqs[:i] {
		delete(s.results, seq)
	}
	s.seqs = s.seqs[i:]
	s.ack = ack
}

// store adds r to the table, keeping it within limits.results: when full,
// the oldest answer goes and the floor rises past it, so a retry of that
// request (or of any older one) is refused rather than applied twice. Every
// entry stays at or above the floor.
func (s *session) store(r *fsmv1.Result) {
	if r.Seq < s.ack {
		return // a floor raised past it: its retry is refused
	}
	if _, ok := s.results[r.Seq]; ok {
		s.results[r.Seq] = r
		return
	}
	if len(s.seqs) >= limits.results {
		if r.Seq < s.seqs[0] {
			// It would be the one evicted.
			s.ack = r.Seq + 1
			return
		}
		s.forgetBelow(s.seqs[0] + 1)
	}
	// Seqs mostly grow, so this is mostly an append.
	i, _ := slices.BinarySearch(s.seqs, r.Seq)
	s.seqs = slices.Insert(s.seqs, i, r.Seq)
	s.results[r.Seq] = r
}
