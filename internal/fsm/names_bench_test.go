package fsm

import (
	"fmt"
	"testing"
)

// BenchmarkNamesInsertDelete: what the name index adds to an Apply that
// creates a lock and one that deletes it, among 100 000 names (one op is
// the insert and the delete).
func BenchmarkNamesInsertDelete(b *testing.B) {
	for _, d := range []int{8, 16, 32, 64} {
		b.Run(fmt.Sprintf("degree=%d", d), func(b *testing.B) {
			old := namesDegree
			defer func() { namesDegree = old }()
			namesDegree = d
			benchNames(b)
		})
	}
}

func benchNames(b *testing.B) {
	t := newNames()
	for i := range 100_000 {
		t.ReplaceOrInsert(&lock{name: fmt.Sprintf("fill/%07d", i)})
	}
	ls := make([]*lock, 1024)
	for i := range ls {
		ls[i] = &lock{name: fmt.Sprintf("fill/%07d-b", (i*7919)%100_000)}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		l := ls[i%len(ls)]
		t.ReplaceOrInsert(l)
		t.Delete(l)
		i++
	}
}
