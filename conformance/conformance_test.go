package conformance

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// cases are the conformance cases, in the order they run.
var cases = []struct {
	name string
	run  func(*testing.T, *env, *checker)
}{
	{"MutualExclusion", caseMutualExclusion},
	{"BusyNamesHolder", caseBusy},
	{"PausedPastTTL", casePause},
	{"DeadlineFromSend", caseDeadlineFromSend},
	{"CutMidAcquire", caseCutMidAcquire},
	{"WatchResumes", caseWatchResume},
	{"Auth", caseAuth},
	{"Semaphore", caseSemaphore},
	{"RWLock", caseRWLock},
	{"Election", caseElection},
	{"Complete", caseComplete},
	{"MultiLockAllOrNothing", caseMultiLockAllOrNothing},
	{"MultiLockNoDeadlock", caseMultiLockNoDeadlock},
	{"HoldBudgetClientFirst", caseHoldBudgetClientFirst},
	{"LeaderKill", caseLeaderKill},
}

// TestConformance runs every case against the driver of
// LOCKD_CONFORMANCE_DRIVER (default: the Go client's driver). The cases
// share one single-node cluster (each uses its own lock names); the
// leader-kill and auth cases start their own.
func TestConformance(t *testing.T) {
	needBinaries(t)
	start := time.Now()
	e := &env{one: startCluster(t, 1), driver: driverCmd}
	// Read here, not only by the drivers, so that go test's cache keys on
	// it: CI's second pass (LOCKD_STREAM=off) must run the suite again.
	t.Logf("driver: %s (LOCKD_STREAM=%q)", strings.Join(driverCmd, " "), os.Getenv("LOCKD_STREAM"))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ck := &checker{t: t}
			c.run(t, e, ck)
			for _, msg := range ck.errs {
				t.Error(msg)
			}
		})
	}
	t.Logf("suite wall time %v", time.Since(start).Round(time.Millisecond))
}

// TestBrokenDriverCaught proves that the suite catches a client that
// ignores the lease deadline: the Go driver run with
// --broken-ignore-deadline (far deadline, guarded always ok, no lease_lost)
// must fail the pause case.
func TestBrokenDriverCaught(t *testing.T) {
	needBinaries(t)
	if os.Getenv("LOCKD_CONFORMANCE_DRIVER") != "" {
		t.Skip("the self-test runs the Go driver only")
	}
	e := &env{one: startCluster(t, 1), driver: []string{goDriverBin, "--broken-ignore-deadline"}}
	ck := &checker{t: t}
	casePause(t, e, ck)
	if !ck.failed() {
		t.Fatal("the pause case passed a driver that ignores the lease deadline")
	}
	// Each of the case's client checks reads its own op or event, and the
	// broken driver breaks each: every one must have fired, or that check
	// could not catch a driver that breaks only what it looks at.
	for _, want := range []string{"is not before the server's expiry", "guarded after the pause", "no lease_lost event", "would still write"} {
		if !slices.ContainsFunc(ck.errs, func(e string) bool { return strings.Contains(e, want) }) {
			t.Errorf("the pause case's check %q did not fire for the broken driver; failures: %q", want, ck.errs)
		}
	}
	t.Logf("the pause case caught the broken driver with %d failures", len(ck.errs))
}

// TestBrokenDeadlineCaught proves that the suite catches a client that
// counts its lease from when a confirmation arrives instead of when its
// request left: the Go driver run with --broken-deadline-from-answer must
// fail the deadline case (its answers come through a delaying proxy).
func TestBrokenDeadlineCaught(t *testing.T) {
	needBinaries(t)
	if os.Getenv("LOCKD_CONFORMANCE_DRIVER") != "" {
		t.Skip("the self-test runs the Go driver only")
	}
	e := &env{one: startCluster(t, 1), driver: []string{goDriverBin, "--broken-deadline-from-answer"}}
	ck := &checker{t: t}
	caseDeadlineFromSend(t, e, ck)
	if !ck.failed() {
		t.Fatal("the deadline case passed a driver that counts the lease from the answers' arrival")
	}
	t.Logf("the deadline case caught the broken driver with %d failures", len(ck.errs))
}

// TestCheckExclusive shows the exclusion check catching an overlap and a
// token that does not increase (the cases rely on it).
func TestCheckExclusive(t *testing.T) {
	good := []hold{{"a", 1, 10, 20}, {"b", 2, 21, 30}, {"a", 5, 31, 40}}
	ck := &checker{t: t}
	checkExclusive(ck, good)
	if ck.failed() {
		t.Fatalf("disjoint holds with increasing tokens refused: %v", ck.errs)
	}
	for name, bad := range map[string][]hold{
		"overlap":    {{"a", 1, 10, 20}, {"b", 2, 20, 30}},
		"same token": {{"a", 1, 10, 20}, {"b", 1, 21, 30}},
		"lower":      {{"a", 3, 10, 20}, {"b", 2, 21, 30}},
	} {
		ck := &checker{t: t}
		checkExclusive(ck, bad)
		if !ck.failed() {
			t.Errorf("%s: not caught", name)
		}
	}
}
