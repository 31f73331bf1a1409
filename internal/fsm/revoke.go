package fsm

import (
	"fmt"

	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// Cooperative revocation: RequestRelease asks a lock's holders to let go.
// It changes no state; it makes one EventReleaseAsked per hold (its
// session and token, the reason as the value), which every watcher of the
// lock sees. The holder decides.

// MaxReasonBytes bounds a RequestRelease's reason.
const MaxReasonBytes = 256

// ValidateRequestRelease reports why Apply refuses c for its fields alone:
// the name, and a reason over MaxReasonBytes.
func ValidateRequestRelease(c *fsmv1.RequestRelease) error {
	if err := ValidateName(c.Name); err != nil {
		return err
	}
	if len(c.Reason) > MaxReasonBytes {
		return fmt.Errorf("reason is %d bytes, more than %d", len(c.Reason), MaxReasonBytes)
	}
	return nil
}

func (f *FSM) applyRequestRelease(c *fsmv1.RequestRelease) *Result {
	if err := ValidateRequestRelease(c); err != nil {
		return fail(CodeInvalid, "%v", err)
	}
	l := f.locks[c.Name]
	if l == nil {
		return &Result{}
	}
	for _, h := range l.holders { // token order
		f.event(EventReleaseAsked, l, h.session, h.token, h.mode, []byte(c.Reason))
	}
	return &Result{Holders: f.holderInfos(l)}
}
