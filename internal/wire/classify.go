package wire

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"

	"connectrpc.com/connect"
)

// ErrClusterMismatch means an endpoint answered with a cluster id other
// than the one the client saw first (lockd.ErrClusterMismatch).
var ErrClusterMismatch = errors.New("lockd: endpoint belongs to another cluster")

// ElectionUnderWay reports whether a node answered that it knows no
// leader (no hint to follow).
func ElectionUnderWay(err error) bool {
	d := ErrorDetail(err)
	if d == nil || d.GetLeaderApi() != "" {
		return false
	}
	switch d.GetReason() {
	case lockdv1.ErrorReason_ERROR_REASON_NOT_LEADER, lockdv1.ErrorReason_ERROR_REASON_NO_LEADER:
		return true
	}
	return false
}

// Retryable reports whether a failed attempt may be retried under the given
// idempotency, and the leader the server named, if any: a server may name
// it in any answer (not only "not leader"), and the client goes there next.
func Retryable(err error, idempotent, timedOut bool) (retry bool, hint string) {
	if errors.Is(err, ErrClusterMismatch) {
		// The other cluster's answer says nothing about ours.
		return true, ""
	}
	if d := ErrorDetail(err); d != nil {
		hint = d.GetLeaderApi()
		switch d.GetReason() {
		case lockdv1.ErrorReason_ERROR_REASON_NOT_LEADER, lockdv1.ErrorReason_ERROR_REASON_NO_LEADER:
			// The node did not take the request.
			return true, hint
		case lockdv1.ErrorReason_ERROR_REASON_OUTCOME_UNKNOWN:
			return idempotent, hint
		case lockdv1.ErrorReason_ERROR_REASON_UNSPECIFIED:
			// Judged by its code below.
		default:
			return false, hint
		}
	}
	if timedOut {
		return idempotent, hint
	}
	if TLSRefused(err) {
		return false, hint // a TLS misconfiguration: no retry heals it
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeUnknown, connect.CodeDeadlineExceeded, connect.CodeCanceled:
		return idempotent || NotSent(err), hint
	}
	return false, hint
}

// Unanswered reports whether a failed attempt got no answer from a server:
// the connection failed or broke before one came.
func Unanswered(err error) bool {
	if ErrorDetail(err) != nil || errors.Is(err, ErrClusterMismatch) {
		return false
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeUnknown, connect.CodeDeadlineExceeded:
		return true
	case connect.CodeCanceled:
		// connect maps a reset or broken connection (ECONNRESET, EPIPE) to
		// Canceled: no server answered. The caller's own cancellation is
		// told apart by its context, before this is asked.
		return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
	}
	return false
}

// NotSent reports whether err shows the request never reached a server.
func NotSent(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}

// IsRefused reports whether an attempt failed because nothing listens at
// the endpoint's address.
func IsRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// NotHTTP reports whether err is a connection that ended without HTTP.
func NotHTTP(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "malformed HTTP") || strings.Contains(msg, "no application protocol")
}

// TLSRefused reports whether err is a TLS handshake that failed on a
// certificate (unknown CA, wrong name, none given where one is required)
// or on a peer that does not speak TLS: a misconfiguration that retrying
// does not heal, returned at once so the cause is seen.
func TLSRefused(err error) bool {
	var verr *tls.CertificateVerificationError
	var alert tls.AlertError
	var rec tls.RecordHeaderError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	if errors.As(err, &verr) || errors.As(err, &alert) || errors.As(err, &rec) || errors.As(err, &unknown) || errors.As(err, &host) {
		return true
	}
	// A TLS alert from the server (certificate required, bad
	// certificate, unknown CA) comes as a net.OpError "remote error".
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "remote error"
}

// ErrorDetail returns the lockd ErrorDetail attached to err, if any.
func ErrorDetail(err error) *lockdv1.ErrorDetail {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	for _, d := range ce.Details() {
		v, err := d.Value()
		if err != nil {
			continue
		}
		if ed, ok := v.(*lockdv1.ErrorDetail); ok {
			return ed
		}
	}
	return nil
}
