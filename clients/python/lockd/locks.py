"""Locks taken through a session: Mutex, Semaphore, RWMutex and Election.

An acquire keeps one seq for all its attempts and long polls, so a resent
or repeated request resumes the same wait and never queues twice. When the
caller gives up (timeout, task cancelled), the wait is withdrawn with a
Cancel naming that seq, which also releases a grant that raced the cancel.
"""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Optional

from . import errors as E
from ._pb import lockd_pb2 as pb
from .session import Session, _dur, lease_deadline

MAX_LONG_POLL = 25.0  # below the server's 30 s cap and common proxy timeouts
WAIT_REPEAT_PAUSE = 0.100
MAX_VALUE = 1024
MIN_MAX_HOLD = 1.0  # below it the client's safety margin leaves almost nothing
MAX_MAX_HOLD = 720 * 3600.0  # the server's largest hold budget


class _Lock:
    def __init__(self, s: Session, name: str, limit: Optional[int], value: bytes = b"", lock_delay: float = 0.0,
                 max_hold: float = 0.0):
        self.session = s
        self.max_hold = max_hold
        self._until: Optional[float] = None  # the hold budget's client deadline (time.monotonic())
        self.name = name
        self.limit = limit
        self.value = value
        self.lock_delay = lock_delay
        self.bad: Optional[str] = None
        if not name:
            self.bad = "empty lock name"
        elif max_hold and not MIN_MAX_HOLD <= max_hold <= MAX_MAX_HOLD:
            self.bad = f"max_hold {max_hold}s outside [1 s, 720 h]"
        elif len(value) > MAX_VALUE:
            self.bad = f"value is {len(value)} bytes, more than {MAX_VALUE}"
        self._busy = False
        self._token = 0
        self._shared = False

    @property
    def token(self) -> int:
        """The fencing token of the current hold, 0 when not held."""
        return self._token

    @property
    def held(self) -> bool:
        """Whether the client still believes it holds the lock: held and the
        session's deadline has not passed (it reads the clock)."""
        return (self._token != 0 and self.session.err is None
                and (self._until is None or time.monotonic() < self._until))

    def check(self) -> int:
        """Returns the token if the lock is held and its lease live, else raises
        NotHeld or LeaseLost: call it right before a guarded write."""
        if self._token == 0:
            raise E.NotHeld(f"lock {self.name!r} not held")
        self.session.check()
        if self._until is not None and time.monotonic() >= self._until:
            raise E.HoldExpired(f"lock {self.name!r}: hold budget ran out")
        return self._token

    @property
    def deadline(self) -> float:
        """Until when the hold may be believed (time.monotonic()): the earlier
        of the session's lease deadline and the hold budget's; 0 when not held."""
        if not self._token:
            return 0.0
        d = self.session.deadline
        return d if self._until is None else min(d, self._until)

    def deadline_unix_ns(self) -> int:
        """deadline as Unix nanoseconds (wall clock); 0 when not held."""
        d = self.deadline
        return self.session._wall0 + int(d * 1e9) if d else 0

    async def _acquire(self, shared: bool, wait: bool, timeout: Optional[float]) -> int:
        s = self.session
        if self.bad:
            raise E.InvalidArgument(f"lock {self.name!r}: {self.bad}")
        s.check()
        if self._token or self._busy:
            raise E.AlreadyHeld(f"acquire {self.name!r}: already held or waited for by this handle")
        self._busy = True
        deadline = time.monotonic() + timeout if timeout is not None else None
        seq = s.seqs.begin()
        mode = pb.MODE_SHARED if shared else pb.MODE_EXCLUSIVE
        # since: the send of a call known to precede the grant (the acquire
        # granted at once, or the last repeat answered "queued"): the hold
        # budget's client deadline counts from it.
        since = 0.0
        try:
            while True:
                sent = time.monotonic()
                since = since or sent
                poll = 0.0
                if wait:
                    poll = MAX_LONG_POLL
                    if deadline is not None:
                        poll = max(min(poll, deadline - time.monotonic()), 0.001)

                def build(**kw):
                    m = pb.AcquireRequest(name=self.name, mode=mode, wait=wait, value=self.value, **kw)
                    if self.limit is not None:
                        m.limit = self.limit
                    if wait:
                        m.poll_timeout.CopyFrom(_dur(poll))
                    if self.lock_delay > 0:
                        m.lock_delay.CopyFrom(_dur(self.lock_delay))
                    if self.max_hold > 0:
                        m.max_hold.CopyFrom(_dur(self.max_hold))
                    return m
                try:
                    resp = await s.call_seq(seq, "Acquire", build, pb.AcquireResponse, name=self.name,
                                            poll=poll, deadline=deadline)
                except E.LockdError as e:
                    if s.err is not None:
                        raise type(s.err)(str(s.err)) from None
                    timed_out = deadline is not None and time.monotonic() >= deadline
                    if wait and not timed_out and isinstance(e, E.Unavailable) and not isinstance(e, E.DEFINITIVE):
                        await asyncio.sleep(WAIT_REPEAT_PAUSE)  # still waiting: the cluster comes back
                        continue
                    if timed_out or not isinstance(e, E.DEFINITIVE):
                        await self._withdraw(seq)
                        seq = 0
                    if timed_out and not isinstance(e, E.Deadline):
                        raise E.Deadline(f"acquire {self.name!r}: timed out ({e})") from None
                    raise
                if resp.status == pb.ACQUIRE_STATUS_GRANTED:
                    if s.err is not None:  # granted after the deadline: of no use
                        raise type(s.err)(str(s.err))
                    budget = resp.max_hold.ToNanoseconds() / 1e9 if resp.HasField("max_hold") else 0.0
                    until = lease_deadline(since, budget) if budget > 0 else None
                    if until is not None and time.monotonic() >= until:
                        token = resp.token
                        s.keep_trying(lambda: s.call("Release", lambda **kw: pb.ReleaseRequest(name=self.name, token=token, **kw),
                                                     pb.ReleaseResponse, name=self.name))
                        raise E.HoldExpired(f"acquire {self.name!r}: granted after the hold's client deadline")
                    self._token, self._shared, self._until = resp.token, shared, until
                    return resp.token
                if resp.status == pb.ACQUIRE_STATUS_QUEUED and wait:
                    since = sent
                    if deadline is not None and time.monotonic() >= deadline:
                        await self._withdraw(seq)
                        seq = 0
                        raise E.Deadline(f"acquire {self.name!r}: timed out while queued")
                    continue
                await self._withdraw(seq)
                seq = 0
                raise E.LockdError(f"acquire {self.name!r}: unexpected status {resp.status}")
        except asyncio.CancelledError:
            if seq:
                # The caller gave up: withdraw the wait, shielded from the cancel.
                task = asyncio.ensure_future(self._withdraw(seq))
                seq = 0
                await asyncio.shield(task)
            raise
        finally:
            self._busy = False
            if seq:
                s.seqs.end(seq)

    async def _withdraw(self, acquire_seq: int):
        """Cancels the wait of the acquire with acquire_seq (and a raced grant);
        retries in the background when that fails, keeping the seq in flight."""
        s = self.session

        def build(**kw):
            return pb.CancelRequest(name=self.name, acquire_seq=acquire_seq, **kw)

        async def once():
            await s.call("Cancel", build, pb.CancelResponse, name=self.name,
                         deadline=time.monotonic() + 2 * s.client._t.request_timeout)
        try:
            await once()
        except E.DEFINITIVE:
            pass
        except E.LockdError:
            # The acquire's seq stays in flight (the server keeps its answer)
            # until the retries end.
            s.keep_trying(once, lambda: s.seqs.end(acquire_seq))
            return
        s.seqs.end(acquire_seq)

    async def _release(self, shared: bool):
        s = self.session
        token = self._token
        if not token or self._shared != shared:
            raise E.NotHeld(f"release {self.name!r}: not held")
        self._token, self._until = 0, None
        if s.err is not None:
            raise type(s.err)(f"release {self.name!r}: {s.err}")

        def build(**kw):
            return pb.ReleaseRequest(name=self.name, token=token, **kw)
        try:
            await s.call("Release", build, pb.ReleaseResponse, name=self.name)
        except E.DEFINITIVE:
            raise
        except E.LockdError:
            if s.err is not None:
                raise
            s.keep_trying(lambda: s.call("Release", build, pb.ReleaseResponse, name=self.name))
            raise

    async def complete(self, retention: float):
        """Marks the job this exclusive hold guards as done and releases the
        lock: for retention seconds, acquiring it raises AlreadyDone."""
        s = self.session
        token = self._token
        if not token or self._shared:
            raise E.NotHeld(f"complete {self.name!r}: not held")
        if not 1.0 <= retention <= 400 * 86400:
            raise E.InvalidArgument(f"complete {self.name!r}: retention {retention}s outside [1s, 400 days]")
        s.check()

        def build(**kw):
            return pb.CompleteRequest(name=self.name, token=token, retention=_dur(retention), **kw)
        try:
            await s.call("Complete", build, pb.CompleteResponse, name=self.name)
        except (E.NotHeld, E.LeaseLost):
            self._token = 0
            raise
        self._token = 0


class Mutex(_Lock):
    """An exclusive lock. ``async with mutex:`` locks (waiting) and unlocks."""

    def __init__(self, s: Session, name: str, value: bytes = b"", lock_delay: float = 0.0, max_hold: float = 0.0):
        super().__init__(s, name, None, value, lock_delay, max_hold)

    async def lock(self, timeout: Optional[float] = None) -> int:
        """Waits (FIFO) for the lock and returns its fencing token."""
        return await self._acquire(False, True, timeout)

    async def try_lock(self) -> int:
        """Takes the lock if free, else raises Busy naming the holder."""
        return await self._acquire(False, False, None)

    async def unlock(self):
        await self._release(False)

    async def __aenter__(self):
        await self.lock()
        return self

    async def __aexit__(self, *exc):
        if self._token:
            await self.unlock()


class Semaphore(_Lock):
    """Up to ``permits`` holders at once (every user must agree on permits)."""

    def __init__(self, s: Session, name: str, permits: int, value: bytes = b""):
        super().__init__(s, name, permits, value)
        if permits <= 0 and not self.bad:
            self.bad = f"semaphore {name!r} needs at least one permit"
        self.permits = permits

    async def acquire(self, timeout: Optional[float] = None) -> int:
        return await self._acquire(True, True, timeout)

    async def try_acquire(self) -> int:
        return await self._acquire(True, False, None)

    async def release(self):
        await self._release(True)

    async def __aenter__(self):
        await self.acquire()
        return self

    async def __aexit__(self, *exc):
        if self._token:
            await self.release()


class RWMutex(_Lock):
    """Many readers or one writer; a waiting writer holds back later readers."""

    def __init__(self, s: Session, name: str, value: bytes = b""):
        super().__init__(s, name, 0, value)

    async def rlock(self, timeout: Optional[float] = None) -> int:
        return await self._acquire(True, True, timeout)

    async def try_rlock(self) -> int:
        return await self._acquire(True, False, None)

    async def lock(self, timeout: Optional[float] = None) -> int:
        return await self._acquire(False, True, timeout)

    async def try_lock(self) -> int:
        return await self._acquire(False, False, None)

    async def runlock(self):
        await self._release(True)

    async def unlock(self):
        await self._release(False)

    async def release(self):
        """Releases whichever hold this handle has."""
        await self._release(self._shared)


class Election:
    """Leader election on a lock name: the leader holds it, with a value."""

    def __init__(self, s: Session, name: str):
        self.session = s
        self.name = name
        self._m: Optional[Mutex] = None

    async def campaign(self, value: bytes, timeout: Optional[float] = None) -> int:
        """Waits until this session leads; returns the leadership's token."""
        if self._m is not None and (self._m._busy or self._m.held):
            raise E.AlreadyHeld(f"campaign {self.name!r}: already campaigning or leading")
        self._m = Mutex(self.session, self.name, value=value)
        return await self._m.lock(timeout)

    async def resign(self):
        if self._m is None:
            raise E.NotHeld(f"resign {self.name!r}: not leading")
        await self._m.unlock()

    async def proclaim(self, value: bytes):
        """Changes the leader's value without giving up leadership."""
        m = self._m
        if m is None or not m.token:
            raise E.NotHeld(f"proclaim {self.name!r}: not leading")
        self.session.check()
        token = m.token

        def build(**kw):
            return pb.SetValueRequest(name=self.name, token=token, value=value, **kw)
        await self.session.call("SetValue", build, pb.SetValueResponse, name=self.name)

    @property
    def token(self) -> int:
        return self._m.token if self._m else 0

    @property
    def leading(self) -> bool:
        return self._m is not None and self._m.held

    async def leader(self):
        """The current leader (a Holder), or raises NoLeader."""
        return await self.session.client.leader(self.name)

    def observe(self) -> AsyncIterator:
        return self.session.client.observe(self.name)
