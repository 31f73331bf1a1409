"""lockd: an asyncio client for the lockd distributed lock service.

    async with lockd.Client("http://127.0.0.1:7070") as c:
        async with await c.session(ttl=10) as s:
            async with s.mutex("invoices/2026-12") as m:
                ...  # m.token is the fencing token

A synchronous wrapper is ``lockd.sync``.
"""

from .client import Client, Event, Leader
from .errors import (AlreadyDone, AlreadyHeld, Busy, ClientClosed, ClusterMismatch, Deadline, Deadlock, Holder, HoldExpired,
                     InvalidArgument, LeaseLost, LimitMismatch, LockdError, NoLeader, NotHeld,
                     PermissionDenied, RateLimited, SessionClosed, TooMany, Unauthenticated, Unavailable,
                     WaitDropped, WatchReset)
from .locks import Election, Mutex, RWMutex, Semaphore
from .multilock import MultiLock
from .session import Session, lease_deadline

__version__ = "0.1.0"

__all__ = [
    "Client", "Event", "Leader", "Session", "Mutex", "Semaphore", "RWMutex", "Election", "MultiLock", "lease_deadline",
    "LockdError", "AlreadyDone", "AlreadyHeld", "Busy", "ClientClosed", "ClusterMismatch", "Deadline", "Deadlock", "Holder", "HoldExpired",
    "InvalidArgument", "LeaseLost", "LimitMismatch", "NoLeader", "NotHeld", "PermissionDenied", "RateLimited",
    "SessionClosed", "TooMany", "Unauthenticated", "Unavailable", "WaitDropped", "WatchReset",
]
