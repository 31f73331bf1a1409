package fsm

import (
	"fmt"
	"testing"

	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// bigSnapshot is an encoded snapshot of n exclusive holds spread over 64
// sessions, shaped like the state TestBigRestart (internal/server) fills.
func bigSnapshot(b testing.TB, n int) []byte {
	b.Helper()
	const sessions = 64
	snap := &fsmv1.Snapshot{ClusterId: "c", Epoch: 1, LastToken: uint64(n) + 1}
	for s := range sessions {
		snap.Sessions = append(snap.Sessions, &fsmv1.Session{Id: fmt.Sprintf("s%02d", s), TtlMs: 10000, CreatedUnixNano: 1})
	}
	for i := range n {
		snap.Locks = append(snap.Locks, &fsmv1.Lock{Name: fmt.Sprintf("lock/%07d", i), Holders: []*fsmv1.Hold{{
			SessionId: fmt.Sprintf("s%02d", i%sessions), Mode: ModeExclusive, Token: uint64(i) + 2, Seq: uint64(i/sessions + 1), GrantedUnixNano: 1_700_000_000_000_000_000 + int64(i),
		}}})
	}
	buf, err := EncodeSnapshot(snap)
	if err != nil {
		b.Fatal(err)
	}
	return buf
}

// BenchmarkRestore1M: decoding and installing a snapshot of 1 000 000
// locks, the bulk of a restart of such a node.
func BenchmarkRestore1M(b *testing.B) {
	buf := bigSnapshot(b, 1_000_000)
	b.Logf("snapshot: %d bytes", len(buf))
	b.ReportAllocs()
	for b.Loop() {
		if err := New(nil).RestoreBytes(buf); err != nil {
			b.Fatal(err)
		}
	}
}
