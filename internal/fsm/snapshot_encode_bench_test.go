package fsm

import "testing"

// BenchmarkSnapshot1M: taking a Raft snapshot of 1 000 000 locks, the part
// that holds the FSM's lock (Apply waits meanwhile) and the whole of it:
// "encode" encodes straight from the state under the lock (Snapshot, both
// parts at once); the way before, "state" built State's messages under the
// lock and "messages" is that plus encoding them (Persist, after the lock).
// B/op is the garbage each snapshot leaves; the bytes are the same.
func BenchmarkSnapshot1M(b *testing.B) {
	f := New(nil)
	if err := f.RestoreBytes(bigSnapshot(b, 1_000_000)); err != nil {
		b.Fatal(err)
	}
	b.Run("encode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			f.mu.RLock()
			_, err := f.encodeLocked()
			f.mu.RUnlock()
			if err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("state", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = f.State()
		}
	})
	b.Run("messages", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			st := f.State()
			if _, err := EncodeSnapshot(st); err != nil {
				b.Fatal(err)
			}
		}
	})
}
