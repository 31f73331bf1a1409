package lockd

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

func TestMapError(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"invalid", apiError(connect.CodeInvalidArgument, lockdv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT), ErrInvalidArgument},
		{"session not found", apiError(connect.CodeNotFound, lockdv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND), ErrLeaseLost},
		{"session revoked", apiError(connect.CodeNotFound, lockdv1.ErrorReason_ERROR_REASON_SESSION_REVOKED), ErrLeaseLost},
		{"busy", apiError(connect.CodeFailedPrecondition, lockdv1.ErrorReason_ERROR_REASON_BUSY), ErrBusy},
		{"already held", apiError(connect.CodeAlreadyExists, lockdv1.ErrorReason_ERROR_REASON_ALREADY_HELD), ErrAlreadyHeld},
		{"not held", apiError(connect.CodeFailedPrecondition, lockdv1.ErrorReason_ERROR_REASON_NOT_HELD), ErrNotHeld},
		{"limit mismatch", apiError(connect.CodeFailedPrecondition, lockdv1.ErrorReason_ERROR_REASON_LIMIT_MISMATCH), ErrLimitMismatch},
		{"not leader", apiError(connect.CodeUnavailable, lockdv1.ErrorReason_ERROR_REASON_NOT_LEADER), ErrUnavailable},
		{"no leader", apiError(connect.CodeUnavailable, lockdv1.ErrorReason_ERROR_REASON_NO_LEADER), ErrUnavailable},
		{"outcome unknown", apiError(connect.CodeUnavailable, lockdv1.ErrorReason_ERROR_REASON_OUTCOME_UNKNOWN), ErrUnavailable},
		{"wait dropped", apiError(connect.CodeAborted, lockdv1.ErrorReason_ERROR_REASON_WAIT_DROPPED), ErrWaitDropped},
		{"too many", apiError(connect.CodeResourceExhausted, lockdv1.ErrorReason_ERROR_REASON_TOO_MANY), ErrTooMany},
		// The reason wins over the code.
		{"reason over code", apiError(connect.CodeInternal, lockdv1.ErrorReason_ERROR_REASON_NOT_HELD), ErrNotHeld},
		// Without a detail, the code decides.
		{"code invalid", connect.NewError(connect.CodeInvalidArgument, errors.New("x")), ErrInvalidArgument},
		{"code not found", connect.NewError(connect.CodeNotFound, errors.New("x")), ErrLeaseLost},
		{"code exists", connect.NewError(connect.CodeAlreadyExists, errors.New("x")), ErrAlreadyHeld},
		{"code unavailable", errConnRefused, ErrUnavailable},
		{"code aborted", connect.NewError(connect.CodeAborted, errors.New("x")), ErrWaitDropped},
		{"code exhausted", connect.NewError(connect.CodeResourceExhausted, errors.New("x")), ErrTooMany},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := mapError(tt.err, "invoices")
			if !errors.Is(got, tt.want) {
				t.Fatalf("mapError(%v) = %v, want Is %v", tt.err, got, tt.want)
			}
			var ce *connect.Error
			if !errors.As(got, &ce) {
				t.Errorf("mapped error %v does not wrap the *connect.Error", got)
			}
			if msg := got.Error(); len(msg) < 7 || msg[:7] != "lockd: " {
				t.Errorf("message %q lacks the lockd: prefix", msg)
			}
		})
	}
}

func TestMapErrorLeavesOthersAlone(t *testing.T) {
	for _, err := range []error{nil, context.Canceled, errors.New("plain"), connect.NewError(connect.CodeInternal, errors.New("boom"))} {
		if got := mapError(err, ""); got != err {
			t.Errorf("mapError(%v) = %v, want unchanged", err, got)
		}
	}
}

func TestBusyErrorHolders(t *testing.T) {
	err := apiError(connect.CodeFailedPrecondition, lockdv1.ErrorReason_ERROR_REASON_BUSY, func(d *lockdv1.ErrorDetail) {
		d.Holders = []*lockdv1.Holder{{SessionId: "s9", Owner: "billing-3/42", Mode: lockdv1.Mode_MODE_EXCLUSIVE, Token: 77, Value: []byte("v")}}
	})
	got := fmt.Errorf("acquire: %w", mapError(err, "invoices/2025-01"))
	var be *BusyError
	if !errors.As(got, &be) {
		t.Fatalf("errors.As(%v, *BusyError) = false", got)
	}
	if len(be.Holders) != 1 || be.Holders[0].Token != 77 || be.Holders[0].Owner != "billing-3/42" || be.Holders[0].Shared || be.Name != "invoices/2025-01" {
		t.Errorf("got %+v", be)
	}
	if !errors.Is(got, ErrBusy) {
		t.Errorf("BusyError is not ErrBusy")
	}
	if want := `lockd: lock "invoices/2025-01" busy: held by session s9 (billing-3/42) with token 77`; be.Error() != want {
		t.Errorf("got %q, want %q", be.Error(), want)
	}
}

func TestSentinelPrefix(t *testing.T) {
	for _, err := range []error{ErrNotHeld, ErrLeaseLost, ErrBusy, ErrAlreadyHeld, ErrLimitMismatch, ErrInvalidArgument,
		ErrUnavailable, ErrClusterMismatch, ErrSessionClosed, ErrWaitDropped, ErrTooMany, ErrClosed} {
		if msg := err.Error(); msg[:7] != "lockd: " {
			t.Errorf("%q lacks the lockd: prefix", msg)
		}
	}
}
