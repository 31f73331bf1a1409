package main

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/anishathalye/porcupine"
)

// opExpire is a session's lease ending on the server without a call: the
// worker saw Done fire, or the tool killed or paused the worker. When it
// happened on the server is not known, only its earliest time.
const opExpire = "expire"

// never is the return time of an operation whose outcome is unknown.
const never = math.MaxInt64

// lockOp is one lock operation of a Go worker, with the register's arrival
// times of its invoke (before the call) and return (after it): an
// interval that contains the real one.
type lockOp struct {
	op, lock, session, slot string
	call, ret               int64
	result                  string
	token                   uint64
}

// collectOps turns the workers' reports into lock operations: each invoke
// paired with its return (none: unknown outcome, never returns); a close
// or a lease loss applies to every lock the session used; a session of a
// killed worker expires from the kill on.
func collectOps(events []Event, windows []window) []lockOp {
	type key struct {
		session string
		id      int64
	}
	pending := map[key][]int{}
	var ops []lockOp
	locks := map[string][]string{} // session → locks used, in order
	slotOf := map[string]string{}
	openAt := map[string]int64{}
	ended := map[string]bool{}
	addLock := func(s, l string) {
		if l != "" && !slices.Contains(locks[s], l) {
			locks[s] = append(locks[s], l)
		}
	}
	var sessionEnds []lockOp // close and expire, expanded per lock below
	for _, e := range events {
		switch e.Kind {
		case kindOpen:
			slotOf[e.Session] = e.Slot
			openAt[e.Session] = e.At
		case kindInvoke:
			k := key{e.Session, e.OpID}
			if e.Op == opAcquireMany || e.Op == opReleaseMany {
				// A set is checked per name as well: one acquire (or
				// release) of each name over the set's one interval.
				op := map[string]string{opAcquireMany: opAcquire, opReleaseMany: opRelease}[e.Op]
				for _, n := range e.Names {
					pending[k] = append(pending[k], len(ops))
					addLock(e.Session, n)
					ops = append(ops, lockOp{op: op, lock: n, session: e.Session, slot: e.Slot, call: e.At, ret: never, result: resUnknown})
				}
				continue
			}
			pending[k] = []int{len(ops)}
			addLock(e.Session, e.Lock)
			ops = append(ops, lockOp{op: e.Op, lock: e.Lock, session: e.Session, slot: e.Slot, call: e.At, ret: never, result: resUnknown})
		case kindReturn:
			idx, ok := pending[key{e.Session, e.OpID}]
			if !ok {
				continue
			}
			delete(pending, key{e.Session, e.OpID})
			for j, i := range idx {
				ops[i].ret, ops[i].result, ops[i].token = e.At, e.Result, e.Token
				if len(e.Tokens) == len(idx) {
					ops[i].token = e.Tokens[j]
				}
				if ops[i].result == resDeadlock {
					// Refused: the server queued nothing, so the call
					// changed no state (cycles checks the refusal).
					ops[i].op = ""
				}
				if ops[i].result != resOK {
					ops[i].ret = never // an error leaves the outcome open
				}
				if ops[i].op == opClose {
					ended[e.Session] = true
				}
			}
		case kindLost:
			call := e.At
			if e.Sent != 0 {
				call = min(call, e.Sent)
			}
			// A pause of the worker while the session was open: the
			// server may have expired it from then on.
			for _, w := range windows {
				if (w.target == e.Slot && strings.HasPrefix(w.kind, "client-") || w.target == "*") && w.start >= openAt[e.Session] && w.start < call {
					call = w.start
				}
			}
			ended[e.Session] = true
			sessionEnds = append(sessionEnds, lockOp{op: opExpire, session: e.Session, slot: e.Slot, call: call, ret: never, result: resOK})
		}
	}
	// Sessions of killed workers.
	for s, slot := range slotOf {
		if ended[s] {
			continue
		}
		for _, w := range windows {
			if w.target == slot && strings.HasPrefix(w.kind, faultClientKill) && w.start >= openAt[s] {
				sessionEnds = append(sessionEnds, lockOp{op: opExpire, session: s, slot: slot, call: w.start, ret: never, result: resOK})
				break
			}
		}
	}
	var out []lockOp
	for _, o := range ops {
		if o.op == "" {
			continue
		}
		if o.op == opClose {
			for _, l := range locks[o.session] {
				c := o
				c.lock = l
				out = append(out, c)
			}
			continue
		}
		out = append(out, o)
	}
	for _, o := range sessionEnds {
		for _, l := range locks[o.session] {
			c := o
			c.lock = l
			out = append(out, c)
		}
	}
	slices.SortStableFunc(out, func(a, b lockOp) int { return cmp.Compare(a.call, b.call) })
	return out
}

// lockState is the model's state of one lock: who holds it and the last
// token granted (tokens must grow in linearization order).
type lockState struct {
	holder string
	last   uint64
}

type lockInput struct{ op, session string }

type lockOutput struct {
	result string
	token  uint64
}

// lockModel is one lock's mutex (the checker runs it per lock): acquire takes a free lock with a larger
// token, release frees the caller's hold, close and expire free the
// session's hold if it has one. An unknown outcome may or may not have
// taken effect.
var lockModel = porcupine.NondeterministicModel{
	Init: func() []any { return []any{lockState{}} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(lockState), input.(lockInput), output.(lockOutput)
		unknown := out.result != resOK
		switch in.op {
		case opAcquire:
			next := []any{}
			if unknown {
				next = append(next, s)
			}
			// Token 0: a backend without tokens (Redlock); only the
			// mutex is checked. A lockd grant without one is reported
			// by the token check.
			if s.holder == "" && (unknown || out.token == 0 || out.token > s.last) {
				n := lockState{holder: in.session, last: max(s.last, out.token)}
				next = append(next, n)
			}
			return next
		case opRelease:
			next := []any{}
			if unknown {
				next = append(next, s)
			}
			if s.holder == in.session {
				next = append(next, lockState{last: s.last})
			}
			return next
		default: // close, expire
			if s.holder == in.session {
				return []any{lockState{last: s.last}}
			}
			return []any{s}
		}
	},
	Equal: func(a, b any) bool { return a.(lockState) == b.(lockState) },
	DescribeOperation: func(input, output any) string {
		in, out := input.(lockInput), output.(lockOutput)
		return fmt.Sprintf("%s(%s) → %s %d", in.op, in.session, out.result, out.token)
	},
}

// linearizable checks the workers' lock operations against lockModel,
// one lock at a time, and for a lock that fits no order names the first
// operation no partial linearization reaches, with the ones before it.
func (c *checker) linearizable(ops []lockOp) string {
	if len(ops) == 0 {
		return "none"
	}
	byLock := map[string][]lockOp{}
	var names []string
	for _, o := range ops {
		if _, ok := byLock[o.lock]; !ok {
			names = append(names, o.lock)
		}
		byLock[o.lock] = append(byLock[o.lock], o)
	}
	verdict := "ok"
	for _, name := range names {
		los := byLock[name]
		ids := map[string]int{}
		hist := make([]porcupine.Operation, 0, len(los))
		for _, o := range los {
			id, ok := ids[o.session]
			if !ok {
				id = len(ids)
				ids[o.session] = id
			}
			hist = append(hist, porcupine.Operation{
				ClientId: id, Input: lockInput{o.op, o.session}, Output: lockOutput{o.result, o.token},
				Call: o.call, Return: o.ret, Metadata: o.lock,
			})
		}
		res, info := porcupine.CheckOperationsVerbose(lockModel.ToModel(), hist, c.p.LinearTimeout)
		switch res {
		case porcupine.Ok:
			continue
		case porcupine.Unknown:
			c.violate("linearizability of %q unknown: the search did not finish within %v", name, c.p.LinearTimeout)
			if verdict == "ok" {
				verdict = "unknown"
			}
			continue
		}
		verdict = "illegal"
		reached := map[int]bool{}
		for _, part := range info.PartialLinearizations() {
			for _, lin := range part {
				for _, k := range lin {
					reached[k] = true
				}
			}
		}
		first := len(los) - 1
		for k := range los {
			if !reached[k] {
				first = k
				break
			}
		}
		var around []string
		for _, o := range los[max(0, first-4) : first+1] {
			ret := "never"
			if o.ret != never {
				ret = fmt.Sprintf("+%dms", (o.ret-los[0].call)/1e6)
			}
			around = append(around, fmt.Sprintf("%s(%s/%s) [+%dms, %s] %s %d", o.op, o.slot, o.session, (o.call-los[0].call)/1e6, ret, o.result, o.token))
		}
		c.violate("not linearizable on %q: no mutex order fits the Go workers' operations; first unplaceable %s; before it: %s",
			name, around[len(around)-1], strings.Join(around[:len(around)-1], "; "))
	}
	return verdict
}
