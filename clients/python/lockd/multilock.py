"""MultiLock: several exclusive locks taken all at once (AcquireMany).

The server decides the whole set in one entry: granted whole, or queued as
one request that holds nothing until it can take every lock, so sets taken
in any order cannot deadlock among themselves. Each lock gets its own
fencing token. Like a single acquire, one seq serves every attempt and long
poll; giving up withdraws the request with a Cancel per lock naming that seq
(one drops the whole queued request; after a raced grant each releases its
hold).
"""

from __future__ import annotations

import asyncio
import time
from typing import Optional

from . import errors as E
from ._pb import lockd_pb2 as pb
from .locks import MAX_LONG_POLL, MAX_VALUE, WAIT_REPEAT_PAUSE
from .session import Session, _dur

MAX_MULTI_LOCKS = 32  # the server's limit


class MultiLock:
    """Exclusive locks on 2 to 32 distinct names, taken together.
    ``async with multi:`` locks (waiting) and unlocks every lock."""

    def __init__(self, s: Session, names, value: bytes = b""):
        self.session = s
        self.names = list(names)
        self.value = value
        self.bad: Optional[str] = None
        if not 2 <= len(self.names) <= MAX_MULTI_LOCKS:
            self.bad = f"a multi-lock takes 2 to {MAX_MULTI_LOCKS} locks, not {len(self.names)}"
        elif len(set(self.names)) != len(self.names) or not all(self.names):
            self.bad = "a lock named twice, or an empty name"
        elif len(value) > MAX_VALUE:
            self.bad = f"value is {len(value)} bytes, more than {MAX_VALUE}"
        self._busy = False
        self._tokens: dict[str, int] = {}

    @property
    def tokens(self) -> dict[str, int]:
        """The fencing token of each lock of the set, by name; empty when not held."""
        return dict(self._tokens)

    @property
    def held(self) -> bool:
        return bool(self._tokens) and self.session.err is None

    def check(self) -> dict[str, int]:
        """Returns the tokens if the set is held and its lease live, else raises
        NotHeld or LeaseLost: call it right before a guarded write."""
        if not self._tokens:
            raise E.NotHeld(f"multi-lock {self.names!r} not held")
        self.session.check()
        return dict(self._tokens)

    async def lock(self, timeout: Optional[float] = None) -> dict[str, int]:
        """Waits until every lock of the set is granted at once; returns the tokens."""
        return await self._acquire(True, timeout)

    async def try_lock(self) -> dict[str, int]:
        """Takes every lock if all are free now, else raises Busy holding none."""
        return await self._acquire(False, None)

    async def _acquire(self, wait: bool, timeout: Optional[float]) -> dict[str, int]:
        s = self.session
        if self.bad:
            raise E.InvalidArgument(f"multi-lock {self.names!r}: {self.bad}")
        s.check()
        if self._tokens or self._busy:
            raise E.AlreadyHeld(f"acquire {self.names!r}: already held or waited for by this handle")
        self._busy = True
        deadline = time.monotonic() + timeout if timeout is not None else None
        seq = s.seqs.begin()
        key = self.names[0]
        try:
            while True:
                poll = 0.0
                if wait:
                    poll = MAX_LONG_POLL
                    if deadline is not None:
                        poll = max(min(poll, deadline - time.monotonic()), 0.001)

                def build(**kw):
                    m = pb.AcquireManyRequest(wait=wait, value=self.value, **kw)
                    for n in self.names:
                        m.locks.add(name=n, mode=pb.MODE_EXCLUSIVE)
                    if wait:
                        m.poll_timeout.CopyFrom(_dur(poll))
                    return m
                try:
                    # AcquireMany is unary only (docs/protocol.md).
                    resp = await s.call_seq(seq, "AcquireMany", build, pb.AcquireManyResponse, name=key,
                                            poll=poll, deadline=deadline)
                except E.LockdError as e:
                    if s.err is not None:
                        raise type(s.err)(str(s.err)) from None
                    timed_out = deadline is not None and time.monotonic() >= deadline
                    if wait and not timed_out and isinstance(e, E.Unavailable) and not isinstance(e, E.DEFINITIVE):
                        await asyncio.sleep(WAIT_REPEAT_PAUSE)
                        continue
                    if timed_out or not isinstance(e, E.DEFINITIVE):
                        await self._withdraw(seq)
                        seq = 0
                    if timed_out and not isinstance(e, E.Deadline):
                        raise E.Deadline(f"acquire {self.names!r}: timed out ({e})") from None
                    raise
                if resp.status == pb.ACQUIRE_STATUS_GRANTED:
                    tokens = {g.name: g.token for g in resp.grants}
                    if any(not tokens.get(n) for n in self.names):
                        await self._withdraw(seq)
                        seq = 0
                        raise E.LockdError(f"acquire {self.names!r}: a grant without a token for every lock")
                    if s.err is not None:  # granted after the deadline: of no use
                        raise type(s.err)(str(s.err))
                    self._tokens = tokens
                    return dict(tokens)
                if resp.status == pb.ACQUIRE_STATUS_QUEUED and wait:
                    if deadline is not None and time.monotonic() >= deadline:
                        await self._withdraw(seq)
                        seq = 0
                        raise E.Deadline(f"acquire {self.names!r}: timed out while queued")
                    continue
                await self._withdraw(seq)
                seq = 0
                raise E.LockdError(f"acquire {self.names!r}: unexpected status {resp.status}")
        except asyncio.CancelledError:
            if seq:
                task = asyncio.ensure_future(self._withdraw(seq))
                seq = 0
                await asyncio.shield(task)
            raise
        finally:
            self._busy = False
            if seq:
                s.seqs.end(seq)

    async def _withdraw(self, acquire_seq: int):
        """Cancels the request of acquire_seq on every lock of the set;
        retries in the background when that fails, keeping the seq in flight."""
        s = self.session

        async def once():
            for n in self.names:
                def build(n=n, **kw):
                    return pb.CancelRequest(name=n, acquire_seq=acquire_seq, **kw)
                await s.call("Cancel", build, pb.CancelResponse, name=n,
                             deadline=time.monotonic() + 2 * s.client._t.request_timeout)
        try:
            await once()
        except E.DEFINITIVE:
            pass
        except E.LockdError:
            s.keep_trying(once, lambda: s.seqs.end(acquire_seq))
            return
        s.seqs.end(acquire_seq)

    async def unlock(self):
        """Releases every lock of the set (each by its token)."""
        s = self.session
        tokens, self._tokens = self._tokens, {}
        if not tokens:
            raise E.NotHeld(f"release {self.names!r}: not held")
        if s.err is not None:
            raise type(s.err)(f"release {self.names!r}: {s.err}")
        first: Optional[E.LockdError] = None
        for n, token in tokens.items():
            def build(n=n, token=token, **kw):
                return pb.ReleaseRequest(name=n, token=token, **kw)
            try:
                await s.call("Release", build, pb.ReleaseResponse, name=n)
            except E.DEFINITIVE as e:
                first = first or e
            except E.LockdError as e:
                if s.err is not None:
                    raise
                s.keep_trying(lambda b=build, n=n: s.call("Release", b, pb.ReleaseResponse, name=n))
                first = first or e
        if first is not None:
            raise first

    async def __aenter__(self):
        await self.lock()
        return self

    async def __aexit__(self, *exc):
        if self._tokens:
            await self.unlock()
