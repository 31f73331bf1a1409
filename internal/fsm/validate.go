package fsm

import (
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/lockd-dev/lockd/internal/label"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// Field checks of the commands a client's request becomes, one function per
// command. Apply runs them (it must refuse bad fields whoever proposed
// them), and the server runs them on the command it is about to propose, so
// a bad request costs no log entry and gets the error Apply would give.
//
// They are exactly Apply's checks, never stricter: an entry already in a log,
// written by any version, must be decided as before (a refusal is kept in
// the duplicate table, so a new refusal would make replicas differ). A
// stricter rule for new requests belongs in the server, before these.
// Release and Cancel have no field checks in Apply (a bad name is simply not
// held); the server checks their names with ValidateName.

// ValidateName reports why name cannot be a lock name, or nil: UTF-8, 1 to
// 512 bytes, no control characters.
func ValidateName(name string) error {
	switch {
	case name == "":
		return errors.New("lock name is empty")
	case len(name) > MaxNameBytes:
		return fmt.Errorf("lock name is %d bytes, more than %d", len(name), MaxNameBytes)
	}
	return label.Check("lock name", name)
}

// ValidateCreateSession reports why Apply refuses c for its fields alone:
// ids, owner and identity within their sizes, a SHA-256 secret hash or none,
// a positive TTL.
func ValidateCreateSession(c *fsmv1.CreateSession) error {
	switch {
	case c.SessionId == "" || len(c.SessionId) > MaxRequestIDBytes:
		return errors.New("bad session id")
	case len(c.RequestId) > MaxRequestIDBytes:
		return fmt.Errorf("request id longer than %d bytes", MaxRequestIDBytes)
	case len(c.Owner) > MaxOwnerBytes:
		return fmt.Errorf("owner longer than %d bytes", MaxOwnerBytes)
	case len(c.SecretHash) != 0 && len(c.SecretHash) != sha256.Size:
		return fmt.Errorf("secret hash is %d bytes, not %d", len(c.SecretHash), sha256.Size)
	case len(c.Identity) > MaxOwnerBytes:
		return fmt.Errorf("identity longer than %d bytes", MaxOwnerBytes)
	case c.TtlMs <= 0:
		return errors.New("ttl must be positive")
	}
	return nil
}

// ValidateAcquire reports why Apply refuses c for its fields alone: the
// name, the mode, the lock-delay's range, the hold budget's and ceiling's
// ranges and the value's size.
func ValidateAcquire(c *fsmv1.Acquire) error {
	if err := ValidateName(c.Name); err != nil {
		return err
	}
	switch {
	case !validMode(c.Mode):
		return fmt.Errorf("unknown mode %d", c.Mode)
	case c.LockDelayMs < 0 || c.LockDelayMs > MaxLockDelayMs:
		return fmt.Errorf("lock-delay %d ms is outside [0, %d]", c.LockDelayMs, MaxLockDelayMs)
	}
	// Both 0 in an entry written before hold budgets: decided as before.
	if err := checkHoldMs("max hold", c.MaxHoldMs); err != nil {
		return err
	}
	if err := checkHoldMs("max hold ceiling", c.MaxHoldCeilingMs); err != nil {
		return err
	}
	return validateValue(c.Value)
}

// ValidateComplete reports why Apply refuses c for its fields alone: a
// retention outside (0, MaxRetentionMs].
func ValidateComplete(c *fsmv1.Complete) error {
	if c.RetentionMs <= 0 || c.RetentionMs > MaxRetentionMs {
		return fmt.Errorf("retention %d ms is outside (0, %d]", c.RetentionMs, int64(MaxRetentionMs))
	}
	return nil
}

// ValidateSetValue reports why Apply refuses c for its fields alone: a value
// over MaxValueBytes.
func ValidateSetValue(c *fsmv1.SetValue) error { return validateValue(c.Value) }

func validateValue(v []byte) error {
	if len(v) > MaxValueBytes {
		return fmt.Errorf("value is %d bytes, more than %d", len(v), MaxValueBytes)
	}
	return nil
}
