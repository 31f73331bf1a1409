"""Errors of the lockd client, mapped from the server's ErrorDetail reasons.

Every error the server sends carries a ``lockd.v1.ErrorDetail`` in the gRPC
status details (trailer ``grpc-status-details-bin``); the client maps its
reason to one of the classes below, falling back to the gRPC code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import grpc

from ._pb import lockd_pb2 as pb
from ._pb import status_pb2

R = pb.ErrorReason


class LockdError(Exception):
    """Base class of every error the client raises."""

    code = "other"  # the conformance driver's error code


class NotHeld(LockdError):
    """The lock is not held (by this session, with this token)."""

    code = "not_held"


class LeaseLost(LockdError):
    """The session's lease is lost: its locks may be held by others now."""

    code = "lease_lost"


class SessionClosed(LeaseLost):
    """The session was closed by its owner."""


class Busy(LockdError):
    """The lock is held and the request did not wait; ``holders`` names them."""

    code = "busy"

    def __init__(self, message: str, holders: Optional[list["Holder"]] = None):
        super().__init__(message)
        self.holders = holders or []


class AlreadyHeld(LockdError):
    """This session already holds or waits for the lock."""

    code = "already_held"


class LimitMismatch(LockdError):
    """The semaphore's permits differ from the lock's limit."""

    code = "invalid"


class InvalidArgument(LockdError):
    """A bad argument (client or server side)."""

    code = "invalid"


class Unavailable(LockdError):
    """No endpoint could serve the call in time."""

    code = "unavailable"


class ClusterMismatch(Unavailable):
    """An endpoint answered for another cluster."""


class WaitDropped(LockdError):
    """The queued wait was cancelled or dropped by the server."""

    code = "other"


class TooMany(LockdError):
    """A server limit was reached."""

    code = "other"


class RateLimited(TooMany):
    """A per-identity rate limit was reached."""


class ClientClosed(LockdError):
    """The client was closed."""

    code = "cancelled"


class AlreadyDone(LockdError):
    """The lock's job was completed (run once): ``mark`` says by whom."""

    code = "done"

    def __init__(self, message: str, mark: Optional[pb.Mark] = None):
        super().__init__(message)
        self.mark = mark


class NoLeader(LockdError):
    """The election has no leader."""

    code = "not_found"


class WatchReset(LockdError):
    """Events were lost to a watch; continue from ``position``."""

    def __init__(self, message: str, position: str = ""):
        super().__init__(message)
        self.position = position


class PermissionDenied(LockdError):
    """Wrong session secret, or the identity may not do this."""

    code = "permission_denied"


class Unauthenticated(LockdError):
    """No or unknown credentials."""

    code = "unauthenticated"


class HoldExpired(LockdError):
    """The hold's budget (max_hold) ran out: the client stopped believing in
    the hold before the server may end it. The session lives on."""

    code = "lease_lost"  # the driver protocol's code: the hold may not be believed


class Deadlock(LockdError):
    """The server refused a wait that would close a cycle of sessions waiting
    for each other (the message names them); nothing was queued."""

    code = "deadlock"


class Deadline(LockdError):
    """The caller's timeout ran out."""

    code = "deadline"


@dataclass(frozen=True)
class Holder:
    """A current holder of a lock, as a Busy error names it."""

    session_id: str
    owner: str
    shared: bool
    token: int
    value: bytes


_BY_REASON = {
    R.ERROR_REASON_INVALID_ARGUMENT: InvalidArgument,
    R.ERROR_REASON_SESSION_NOT_FOUND: LeaseLost,
    R.ERROR_REASON_SESSION_REVOKED: LeaseLost,
    R.ERROR_REASON_ALREADY_HELD: AlreadyHeld,
    R.ERROR_REASON_NOT_HELD: NotHeld,
    R.ERROR_REASON_LIMIT_MISMATCH: LimitMismatch,
    R.ERROR_REASON_NOT_LEADER: Unavailable,
    R.ERROR_REASON_NO_LEADER: Unavailable,
    R.ERROR_REASON_OUTCOME_UNKNOWN: Unavailable,
    R.ERROR_REASON_WAIT_DROPPED: WaitDropped,
    R.ERROR_REASON_TOO_MANY: TooMany,
    R.ERROR_REASON_PERMISSION_DENIED: PermissionDenied,
    R.ERROR_REASON_UNAUTHENTICATED: Unauthenticated,
    R.ERROR_REASON_RATE_LIMITED: RateLimited,
    R.ERROR_REASON_DEADLOCK: Deadlock,
}

_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: LeaseLost,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyHeld,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.ABORTED: WaitDropped,
    grpc.StatusCode.RESOURCE_EXHAUSTED: TooMany,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
}

_DETAIL_URL = "type.googleapis.com/lockd.v1.ErrorDetail"


def error_detail(err: grpc.RpcError) -> Optional[pb.ErrorDetail]:
    """Returns the ErrorDetail a gRPC error carries, or None."""
    if hasattr(err, "_detail"):
        return err._detail  # a call's error on the session stream
    md = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for k, v in md or ():
        if k != "grpc-status-details-bin":
            continue
        st = status_pb2.RpcStatus()
        try:
            st.ParseFromString(v)
        except Exception:  # noqa: BLE001 - a malformed trailer is no detail
            return None
        for d in st.details:
            if d.type_url == _DETAIL_URL:
                ed = pb.ErrorDetail()
                ed.ParseFromString(d.value)
                return ed
    return None


def holders_of(d: pb.ErrorDetail) -> list[Holder]:
    return [
        Holder(h.session_id, h.owner, h.mode == pb.MODE_SHARED, h.token, h.value)
        for h in d.holders
    ]


def from_rpc(err: grpc.RpcError, name: str = "") -> LockdError:
    """Maps a gRPC error to the client's error class."""
    msg = err.details() or str(err.code())
    where = f"lock {name!r}: " if name else ""
    d = error_detail(err)
    if d is not None and d.reason != R.ERROR_REASON_UNSPECIFIED:
        if d.reason == R.ERROR_REASON_BUSY:
            hs = holders_of(d)
            who = f": held by session {hs[0].session_id} ({hs[0].owner}) with token {hs[0].token}" if hs else ""
            return Busy(f"{where}busy{who}", hs)
        if d.reason == R.ERROR_REASON_ALREADY_DONE:
            m = d.mark if d.HasField("mark") else None
            by = f" by {m.owner} (token {m.token})" if m is not None else ""
            return AlreadyDone(f"{where}already done{by}", m)
        cls = _BY_REASON.get(d.reason)
        if cls is not None:
            return cls(f"{where}{msg}")
    cls = _BY_CODE.get(err.code(), LockdError)
    return cls(f"{where}{msg}")


# Errors after which retrying a lock call cannot help.
DEFINITIVE = (Busy, InvalidArgument, AlreadyHeld, LimitMismatch, WaitDropped, TooMany, NotHeld,
              ClientClosed, ClusterMismatch, AlreadyDone, PermissionDenied, Unauthenticated, Deadlock)
