package fsm

import (
	"hash/fnv"

	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

func setValueFingerprint(c *fsmv1.SetValue) fingerprint {
	h := fnv.New64a()
	h.Write(c.Value)
	return fingerprintOf(byte(CmdSetValue), c.Name, c.Token, h.Sum64())
}

// valueBytes is a hold's or wait's value as the []byte messages and events
// carry: nil when empty, else a copy.
func valueBytes(v string) []byte {
	if v == "" {
		return nil
	}
	return []byte(v)
}

// applySetValue replaces the value of a hold of the session (named by its
// token) without releasing it: an election leader's Proclaim. Like every
// session request it is answered once per seq (a repeat gets the first
// answer from the duplicate table, and changes nothing again).
func (f *FSM) applySetValue(c *fsmv1.SetValue) *Result {
	fp := setValueFingerprint(c)
	s, r := f.request(c.SessionId, c.Seq, c.Ack, fp, 0)
	if r != nil {
		return r
	}
	if err := ValidateSetValue(c); err != nil {
		return f.remember(s, c.Seq, fp, fail(CodeInvalid, "%v", err))
	}
	h := s.holds[c.Name]
	if h == nil || h.token != c.Token {
		return f.remember(s, c.Seq, fp, fail(CodeNotHeld, "lock %q is not held with token %d by this session", c.Name, c.Token))
	}
	h.value = string(c.Value)
	f.event(EventValueChanged, f.locks[c.Name], s.id, h.token, h.mode, c.Value)
	return f.remember(s, c.Seq, fp, &Result{})
}
