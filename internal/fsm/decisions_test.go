package fsm_test

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// lockLines writes the lock events (those the watch reports), with their
// positions.
type lockLines struct{ out *strings.Builder }

func (l lockLines) Events(index uint64, evs []fsm.Event) {
	for _, e := range evs {
		if e.Kind >= 101 {
			continue
		}
		fmt.Fprintf(l.out, "ev %d.%d k%d %q s=%s o=%q t=%d m=%d l=%d v=%x\n", e.Index, e.Num, e.Kind, e.Name, e.Session, e.Owner, e.Token, e.Mode, e.Limit, e.Value)
	}
}
func (l lockLines) Reset(from uint64) { fmt.Fprintf(l.out, "reset %d\n", from) }

var updateDecisions = flag.Bool("update-decisions", false, "rewrite testdata/decisions.golden.gz (only for a deliberate change of what Apply decides: see docs/design.md, \"Mixed versions\")")

// TestDecisionsUnchanged replays seeded random command streams (valid and
// invalid fields, repeats, stale terms, wrong secrets, lock-delays, marks)
// and compares, line by line, what Apply answered, the lock events with
// their positions, what the leader's timers and blocked calls hear, the
// final state and how mutated snapshots load, against a golden trace
// recorded from an earlier version of the FSM (commit 524aff0, before its
// Observer was folded into the event stream; within one entry the
// consumer lines are compared as a set, since that version told them in
// another order, to separate consumers). Replicas of different
// versions apply the same log: any difference here is a decision an older
// node would make differently.
func TestDecisionsUnchanged(t *testing.T) {
	var out strings.Builder
	for seed := uint64(1); seed <= 16; seed++ {
		trace(&out, seed)
	}
	path := filepath.Join("testdata", "decisions.golden.gz")
	if *updateDecisions {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		if _, err := zw.Write([]byte(out.String())); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	want, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	got, wantLines := strings.Split(out.String(), "\n"), strings.Split(string(want), "\n")
	for i := range min(len(got), len(wantLines)) {
		if got[i] != wantLines[i] {
			t.Fatalf("line %d differs from the recorded decisions:\n got: %s\nwant: %s", i+1, got[i], wantLines[i])
		}
	}
	if len(got) != len(wantLines) {
		t.Fatalf("trace has %d lines, the recorded one %d", len(got), len(wantLines))
	}
}

// trace applies one seeded stream of commands to a new FSM and writes each
// answer, its events, the final state's hash and how mutated copies of that
// state load.
func trace(out *strings.Builder, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	obs := &obsLines{out: out}
	f := newTraced(lockLines{out}, obs)
	var index uint64
	tokens := []uint64{0, 101, 102}
	term := uint64(1)
	apply := func(ct fsm.CmdType, m proto.Message) {
		b, err := fsm.Encode(ct, m)
		if err != nil {
			panic(err)
		}
		index++
		r := f.Apply(&raft.Log{Index: index, Term: term, Type: raft.LogCommand, Data: b}).(*fsm.Result)
		obs.flush()
		if r.Token != 0 {
			tokens = append(tokens, r.Token)
		}
		fmt.Fprintf(out, "%d %d: code=%d msg=%q st=%d tok=%d pos=%d rel=%v dup=%v sid=%q\n", seed, index, r.Code, r.Msg, r.Status, r.Token, r.Position, r.Released, r.Duplicate, r.SessionID)
	}
	apply(fsm.CmdInit, &fsmv1.Init{ClusterId: "c", Epoch: 100})
	sessions := []string{"s0", "s1", "s2", "s3", "s4"}
	names := []string{"a", "b", "c", "a/x", "", "bad\x01", strings.Repeat("n", 600)}
	secret := func(id string) []byte { h := sha256.Sum256([]byte(id)); return h[:] }
	seqs := map[string]uint64{}
	var last proto.Message
	var lastT fsm.CmdType
	pick := func(xs []string) string { return xs[rng.IntN(len(xs))] }
	now := int64(1000)
	for i := 0; i < 600; i++ {
		now += int64(rng.IntN(1000))
		if last != nil && rng.IntN(8) == 0 {
			apply(lastT, last) // a retry of the same request
			continue
		}
		s := pick(sessions)
		seq := func() uint64 {
			if rng.IntN(15) == 0 {
				return uint64(rng.IntN(4)) // reused or zero seq
			}
			seqs[s]++
			return seqs[s]
		}
		ack := func() uint64 {
			if rng.IntN(3) == 0 && seqs[s] > 2 {
				return seqs[s] - 2
			}
			return 0
		}
		sh := secret(s)
		if rng.IntN(20) == 0 {
			sh = secret("wrong")
		}
		var m proto.Message
		var ct fsm.CmdType
		switch rng.IntN(14) {
		case 0, 1:
			ttl := int64(1000 + rng.IntN(5000))
			if rng.IntN(10) == 0 {
				ttl = -1
			}
			owner := "own-" + s
			if rng.IntN(15) == 0 {
				owner = strings.Repeat("o", 300)
			}
			ct, m = fsm.CmdCreateSession, &fsmv1.CreateSession{RequestId: "r" + s + fmt.Sprint(rng.IntN(2)), SessionId: s, TtlMs: ttl, Owner: owner, TimeUnixNano: now, SecretHash: sh, IdentitySessionsCap: uint32(rng.IntN(4))}
		case 2, 3, 4:
			var lim *uint32
			if rng.IntN(4) == 0 {
				v := uint32(rng.IntN(3))
				lim = &v
			}
			mode := int32(1 + rng.IntN(2))
			if rng.IntN(15) == 0 {
				mode = int32(rng.IntN(6))
			}
			val := []byte(fmt.Sprint(i))
			if rng.IntN(20) == 0 {
				val = make([]byte, 1100)
			}
			delay := int64(0)
			if rng.IntN(3) == 0 {
				delay = int64(rng.IntN(3)) * 1000
				if rng.IntN(10) == 0 {
					delay = -5
				}
			}
			ct, m = fsm.CmdAcquire, &fsmv1.Acquire{SessionId: s, Seq: seq(), Ack: ack(), Name: pick(names), Mode: mode, Limit: lim, Wait: rng.IntN(2) == 0, Value: val, TimeUnixNano: now, LockDelayMs: delay, SecretHash: sh}
		case 5, 6:
			ct, m = fsm.CmdRelease, &fsmv1.Release{SessionId: s, Seq: seq(), Ack: ack(), Name: pick(names), Token: tokens[rng.IntN(len(tokens))], TimeUnixNano: now, SecretHash: sh}
		case 7:
			ct, m = fsm.CmdCancel, &fsmv1.Cancel{SessionId: s, Seq: seq(), Ack: ack(), Name: pick(names), AcquireSeq: uint64(rng.IntN(int(seqs[s] + 2))), TimeUnixNano: now, SecretHash: sh}
		case 8, 13:
			ret := int64(1000 + rng.IntN(3))
			if rng.IntN(8) == 0 {
				ret = 0
			}
			ct, m = fsm.CmdComplete, &fsmv1.Complete{SessionId: s, Seq: seq(), Ack: ack(), Name: pick(names[:4]), Token: tokens[rng.IntN(len(tokens))], RetentionMs: ret, TimeUnixNano: now, SecretHash: sh}
		case 9:
			val := []byte("v" + fmt.Sprint(i))
			if rng.IntN(10) == 0 {
				val = make([]byte, 2000)
			}
			ct, m = fsm.CmdSetValue, &fsmv1.SetValue{SessionId: s, Seq: seq(), Ack: ack(), Name: pick(names), Token: tokens[rng.IntN(len(tokens))], Value: val, SecretHash: sh}
		case 10:
			if rng.IntN(2) == 0 {
				ct, m = fsm.CmdSetValue, &fsmv1.SetValue{SessionId: s, Seq: seq(), Ack: ack(), Name: pick(names[:3]), Token: tokens[rng.IntN(len(tokens))], Value: []byte("w"), SecretHash: sh}
				break
			}
			switch rng.IntN(3) {
			case 0:
				ct, m = fsm.CmdCloseSession, &fsmv1.CloseSession{SessionId: s, Seq: seq(), SecretHash: sh}
			case 1:
				if rng.IntN(6) == 0 {
					term++
				}
				ct, m = fsm.CmdExpireSession, &fsmv1.ExpireSession{SessionId: s, TimeUnixNano: now, Term: term - uint64(rng.IntN(2)), Forced: rng.IntN(3) == 0}
			default:
				ct, m = fsm.CmdRevokeSession, &fsmv1.RevokeSession{SessionIds: []string{s, pick(sessions)}, TimeUnixNano: now}
			}
		case 11:
			ct, m = fsm.CmdClearMark, &fsmv1.ClearMark{Name: pick(names[:4]), Token: tokens[rng.IntN(len(tokens))], Term: term - uint64(rng.IntN(2))}
		default:
			ct, m = fsm.CmdUndelay, &fsmv1.Undelay{Name: pick(names[:4]), Token: tokens[rng.IntN(len(tokens))], Term: term - uint64(rng.IntN(2)), TimeUnixNano: now}
		}
		// tokens grow: keep the candidates near the counter
		if len(tokens) > 12 {
			tokens = append(tokens[:1], tokens[len(tokens)-8:]...)
		}
		last, lastT = m, ct
		apply(ct, m)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(f.State())
	if err != nil {
		panic(err)
	}
	fmt.Fprintf(out, "%d state %x\n", seed, sha256.Sum256(b))
	for k := 0; k < 25; k++ {
		st := proto.Clone(f.State()).(*fsmv1.Snapshot)
		mutate(rng, st)
		g := fsm.New(nil)
		err := g.Load(st)
		h := ""
		if err == nil {
			b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(g.State())
			h = fmt.Sprintf("%x", sha256.Sum256(b))
		}
		fmt.Fprintf(out, "%d load %d: %v %s\n", seed, k, err, h)
	}
}

// mutate breaks st in one or two of the ways decodeState checks for.
func mutate(rng *rand.Rand, st *fsmv1.Snapshot) {
	for n := 1 + rng.IntN(2); n > 0; n-- {
		switch rng.IntN(16) {
		case 0:
			if len(st.Locks) > 1 {
				st.Locks[0], st.Locks[1] = st.Locks[1], st.Locks[0]
			}
		case 1:
			if len(st.Locks) > 0 {
				st.Locks = append(st.Locks, proto.Clone(st.Locks[0]).(*fsmv1.Lock))
			}
		case 2:
			for _, l := range st.Locks {
				for _, h := range l.Holders {
					h.Token = uint64(rng.IntN(3))
				}
			}
		case 3:
			if len(st.Sessions) > 0 {
				st.Sessions = st.Sessions[1:]
			}
		case 4:
			if len(st.Sessions) > 0 {
				st.Sessions = append(st.Sessions, proto.Clone(st.Sessions[0]).(*fsmv1.Session))
			}
		case 5:
			for _, l := range st.Locks {
				l.LockDelayMs = int64(rng.IntN(3)) - 1
				l.Delayed = rng.IntN(2) == 0
			}
		case 6:
			for _, l := range st.Locks {
				for _, h := range l.Holders {
					h.Mode = int32(rng.IntN(4))
				}
			}
		case 7:
			for _, l := range st.Locks {
				l.Limit = uint32(rng.IntN(3))
			}
		case 8:
			for _, l := range st.Locks {
				if len(l.Holders) > 0 {
					l.Queue = append(l.Queue, &fsmv1.Wait{SessionId: l.Holders[0].SessionId, Mode: 1, Seq: 9})
				}
			}
		case 9:
			for _, l := range st.Locks {
				l.Holders = nil
			}
		case 10:
			st.LastToken = st.Epoch - 1
		case 11:
			for _, s := range st.Sessions {
				s.TtlMs = int64(rng.IntN(2)) - 1
			}
		case 12:
			for _, l := range st.Locks {
				l.Mark = &fsmv1.Mark{Token: uint64(rng.IntN(200)), RetentionMs: int64(rng.IntN(2))}
			}
		case 13:
			st.Members = append(st.Members, &fsmv1.MemberInfo{NodeId: fmt.Sprint(rng.IntN(2))[:rng.IntN(2)]})
		case 14:
			for _, s := range st.Sessions {
				s.SecretHash = s.SecretHash[:rng.IntN(2)*len(s.SecretHash)/2]
			}
		default:
			for _, l := range st.Locks {
				if len(l.Queue) > 0 {
					l.Queue[0].SessionId = "nobody"
				}
			}
		}
	}
}

// obsLines writes, per entry, what the leader's timers and the blocked
// Acquire calls hear (sessions created, removed, revoked; queued requests
// granted or dropped; marks set and cleared; lock-delays started and
// ended). A grant is written only for a request that was queued: a grant
// at once wakes nobody.
type obsLines struct {
	out    *strings.Builder
	buf    strings.Builder
	queued map[string]bool
}

// flush writes the entry's consumer lines in sorted order: within one
// entry the consumers (separate timers, separate waiters) do not depend on
// the order they hear of things.
func (o *obsLines) flush() {
	lines := strings.SplitAfter(o.buf.String(), "\n")
	slices.Sort(lines)
	o.out.WriteString(strings.Join(lines, ""))
	o.buf.Reset()
}

// both feeds an FSM's events to the lock-event lines and the consumer lines.
type both struct {
	a lockLines
	o *obsLines
}

func (b both) Events(i uint64, evs []fsm.Event) {
	b.a.Events(i, evs)
	if b.o.queued == nil {
		b.o.queued = map[string]bool{}
	}
	for _, e := range evs {
		k := fmt.Sprintf("%s %q %d", e.Session, e.Name, e.Seq)
		switch e.Kind {
		case fsm.EventSessionCreated:
			fmt.Fprintf(&b.o.buf, "obs created %s %d\n", e.Session, e.DurationMs)
		case fsm.EventSessionRemoved:
			fmt.Fprintf(&b.o.buf, "obs removed %s\n", e.Session)
		case fsm.EventSessionRevoked:
			fmt.Fprintf(&b.o.buf, "obs revoked %s\n", e.Session)
		case fsm.EventQueued:
			b.o.queued[k] = true
		case fsm.EventGranted:
			if b.o.queued[k] {
				delete(b.o.queued, k)
				fmt.Fprintf(&b.o.buf, "obs granted %s %d\n", k, e.Token)
			}
		case fsm.EventDequeued:
			delete(b.o.queued, k)
			fmt.Fprintf(&b.o.buf, "obs dropped %s\n", k)
		case fsm.EventCompleted:
			fmt.Fprintf(&b.o.buf, "obs marked %q %d %d\n", e.Name, e.Token, e.DurationMs)
		case fsm.EventMarkCleared:
			fmt.Fprintf(&b.o.buf, "obs unmarked %q %d\n", e.Name, e.Token)
		case fsm.EventDelayStarted:
			fmt.Fprintf(&b.o.buf, "obs lockdelay %q %d %d\n", e.Name, e.Token, e.DurationMs)
		case fsm.EventDelayEnded:
			fmt.Fprintf(&b.o.buf, "obs undelayed %q %d\n", e.Name, e.Token)
		}
	}
}
func (b both) Reset(from uint64) { b.a.Reset(from) }

func newTraced(l lockLines, o *obsLines) *fsm.FSM { return fsm.New(both{l, o}) }
