"""Sessions: leases kept alive in the background, with the client deadline.

The client treats a lease as lost strictly before any server may expire it:
at ``sent + TTL*0.99 - max(100 ms, 2 % TTL)``, where ``sent`` is when the
newest confirmed KeepAlive (or the CreateSession) left the client. The server
started its own TTL when it received the request, after ``sent``, so with a
client clock at most 1 % slow the client gives up first; the margin covers
scheduling delays. KeepAlive goes out TTL/3 after the last confirmed one was
sent, and every max(50 ms, TTL/10) while confirmations fail.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import time
from typing import Callable, Optional

import grpc
from google.protobuf import duration_pb2

from . import errors as E
from ._pb import lockd_pb2 as pb


def lease_deadline(sent: float, ttl: float) -> float:
    """The client-side end of a lease of ttl confirmed by a request sent at sent."""
    return sent + ttl - ttl / 100 - max(0.100, ttl / 50)


def renew_interval(ttl: float) -> float:
    return ttl / 3


def jeopardy_interval(ttl: float) -> float:
    return max(0.050, ttl / 10)


def keepalive_timeout(ttl: float, request_timeout: float) -> float:
    return min(request_timeout, max(0.050, ttl / 4))


def default_owner() -> str:
    host = socket.gethostname() or "unknown"
    return f"{host}/{os.getpid()}"


def _dur(seconds: float):
    ns = int(round(seconds * 1e9))
    # Set directly: Duration.FromNanoseconds is Python code, dear per call.
    return duration_pb2.Duration(seconds=ns // 1_000_000_000, nanos=ns % 1_000_000_000)


class Seqs:
    """A session's request sequence numbers and its ack (lowest seq in flight)."""

    def __init__(self):
        self.last = 0
        self.inflight: list[int] = []

    def begin(self) -> int:
        self.last += 1
        self.inflight.append(self.last)
        return self.last

    def end(self, seq: int):
        try:
            self.inflight.remove(seq)
        except ValueError:
            pass

    def ack(self) -> int:
        return self.inflight[0] if self.inflight else self.last + 1


class Session:
    """A lease on the cluster. Create it with ``Client.session()``; use it as
    ``async with`` so that it is closed (its locks released) at the end."""

    def __init__(self, client, session_id: str, secret: str, ttl: float, owner: str, sent: float,
                 on_deadline: Optional[Callable[[float], None]] = None):
        self.client = client
        self.id = session_id
        self._secret = secret  # presented with every session-scoped call; never shown
        self.ttl = ttl
        self.owner = owner
        self.seqs = Seqs()
        self._sent = sent
        self._deadline = lease_deadline(sent, ttl)
        # Wall clock minus monotonic clock, once: deadlines shown as Unix
        # times stay put between calls.
        self._wall0 = time.time_ns() - int(time.monotonic() * 1e9)
        self._err: Optional[E.LockdError] = None
        self._closing = False
        self._told_server = False
        self._on_deadline = on_deadline
        self._lost_cbs: list[Callable[[E.LockdError], None]] = []
        self.done = asyncio.Event()  # set when the session ends (lost or closed)
        self._bg: set[asyncio.Task] = set()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_at(self._deadline, self._expire)
        self._loop_task = loop.create_task(self._keepalive())
        if on_deadline:
            on_deadline(self._deadline)

    def __repr__(self):
        return f"Session(id={self.id!r}, ttl={self.ttl}, owner={self.owner!r})"

    # -- the lease -----------------------------------------------------------

    @property
    def deadline(self) -> float:
        """The client deadline, in time.monotonic() seconds."""
        return self._deadline

    def deadline_unix_ns(self) -> int:
        """The client deadline as Unix nanoseconds (wall clock)."""
        return self._wall0 + int(self._deadline * 1e9)

    def on_lost(self, cb: Callable[[E.LockdError], None]):
        """Calls cb(error) once when the session ends (at once if it has)."""
        if self._err is not None:
            cb(self._err)
        else:
            self._lost_cbs.append(cb)

    @property
    def err(self) -> Optional[E.LockdError]:
        """None while the lease is live, else why it ended. It reads the clock:
        past the deadline the session is lost now, whatever the timer did."""
        if self._err is None and time.monotonic() >= self._deadline:
            self._lose(E.LeaseLost(f"session {self.id}: no keepalive confirmed before the client deadline"))
        return self._err

    def check(self):
        """Raises the session's error if it is not live."""
        err = self.err
        if err is not None:
            raise type(err)(str(err))

    def _expire(self):
        if self._err is not None:
            return
        if time.monotonic() < self._deadline:
            self._timer = asyncio.get_running_loop().call_at(self._deadline, self._expire)
            return
        self._lose(E.LeaseLost(f"session {self.id}: no keepalive confirmed before the client deadline"))

    def _lose(self, err: E.LockdError):
        if self._err is not None:
            return
        if not isinstance(err, (E.LeaseLost, E.ClientClosed)):
            err = E.LeaseLost(f"session {self.id}: {err}")
        self._err = err
        self._timer.cancel()
        self.done.set()
        for cb in self._lost_cbs:
            try:
                cb(err)
            except Exception:  # noqa: BLE001 - a user callback must not stop the others
                pass
        self._lost_cbs.clear()

    def _confirmed(self, sent: float, ttl: float):
        if self._err is not None:
            return
        if time.monotonic() >= self._deadline:
            self._lose(E.LeaseLost(f"session {self.id}: keepalive confirmed after the client deadline"))
            return
        d = lease_deadline(sent, ttl)
        if d <= self._deadline:
            return
        self._sent, self._deadline = sent, d
        if self._on_deadline:
            self._on_deadline(d)

    async def _keepalive(self):
        t = self.client._t
        next_at = self._sent + renew_interval(self.ttl)
        try:
            while self._err is None:
                sent, ttl, err = await self._renew(next_at)
                if self._err is not None:
                    break
                if isinstance(err, E.LeaseLost):
                    self._lose(E.LeaseLost(f"keepalive: {err}"))
                    break
                if err is not None:
                    next_at = time.monotonic() + jeopardy_interval(self.ttl)
                    continue
                self._confirmed(sent, ttl or self.ttl)
                next_at = self._sent + renew_interval(ttl or self.ttl)
        except asyncio.CancelledError:
            t.ka.unschedule(self)
            return
        t.ka.unschedule(self)
        if not self._closing and not isinstance(self._err, E.SessionClosed):
            # Lost: tell the server, so that the holds go now, not at expiry.
            try:
                await self._close_on_server()
            except E.LockdError:
                pass
            self.client._sessions.discard(self)

    async def _renew(self, next_at: float):
        """One renewal at next_at: in the client's next keepalive batch over
        the session stream, else a unary KeepAlive. Returns (sent, ttl, error)."""
        t = self.client._t
        if t.stream_on:
            r = await t.ka.schedule(self, next_at)
            if not r.unary:
                err = r.err
                if err is not None and not isinstance(err, E.LockdError):
                    err = E.from_rpc(err) if isinstance(err, grpc.RpcError) else E.Unavailable(str(err))
                return r.sent, r.ttl or self.ttl, err
        else:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        if self._err is not None:
            return 0.0, 0.0, None
        sent = time.monotonic()
        try:
            resp = await t.call("LockService", "KeepAlive", pb.KeepAliveRequest(session_id=self.id, secret=self._secret),
                                pb.KeepAliveResponse, idempotent=True, once=True,
                                timeout=keepalive_timeout(self.ttl, t.request_timeout), until=lambda: self._deadline)
        except E.LockdError as e:
            return sent, 0.0, e
        return sent, (resp.ttl.ToNanoseconds() / 1e9 if resp.HasField("ttl") else 0.0) or self.ttl, None

    # -- calls ---------------------------------------------------------------

    async def call(self, method: str, build, resp_cls, *, name: str = "", poll: float = 0.0,
                   deadline: Optional[float] = None):
        """Sends a session-scoped call with a fresh seq (resent with the same seq)."""
        seq = self.seqs.begin()
        try:
            return await self.call_seq(seq, method, build, resp_cls, name=name, poll=poll, deadline=deadline)
        finally:
            self.seqs.end(seq)

    async def call_seq(self, seq: int, method: str, build, resp_cls, *, name: str = "", poll: float = 0.0,
                       deadline: Optional[float] = None):
        msg = build(session_id=self.id, secret=self._secret, seq=seq, ack=self.seqs.ack())
        try:
            return await self.client._t.call("LockService", method, msg, resp_cls, idempotent=True, name=name,
                                             poll=poll, deadline=deadline, until=lambda: self._deadline)
        except E.LeaseLost as e:
            self._lose(e)
            raise

    def keep_trying(self, coro_fn, done: Optional[Callable[[], None]] = None):
        """Runs coro_fn() in the background until it succeeds, fails
        definitively, or the session ends (the server then drops it); then
        done(). When the session already ended it runs only done()."""
        async def run():
            delay = 0.05
            try:
                while self._err is None:
                    try:
                        await coro_fn()
                        return
                    except E.DEFINITIVE:
                        return
                    except E.LockdError:
                        await asyncio.sleep(random_jitter(delay))
                        delay = min(delay * 2, 2.0)
            finally:
                if done:
                    done()
        if self._err is not None:
            if done:
                done()
            return
        task = asyncio.get_running_loop().create_task(run())
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    # -- closing -------------------------------------------------------------

    async def _close_on_server(self):
        if self._told_server:
            return
        self._told_server = True
        seq = self.seqs.begin()
        t = self.client._t
        msg = pb.CloseSessionRequest(session_id=self.id, seq=seq, secret=self._secret)
        try:
            await t.call("LockService", "CloseSession", msg, pb.CloseSessionResponse, idempotent=True,
                         timeout=keepalive_timeout(self.ttl, t.request_timeout),
                         deadline=time.monotonic() + t.request_timeout * 2)
        except E.LeaseLost:
            pass
        finally:
            self.seqs.end(seq)

    async def close(self):
        """Ends the session: keepalives stop and the server releases every
        hold and drops every wait of it. Closing twice does nothing."""
        if self._closing:
            return
        self._closing = True
        lost = self._err is not None
        if not lost:
            self._lose(E.SessionClosed(f"session {self.id} closed"))
        self._loop_task.cancel()
        for task in list(self._bg):
            task.cancel()
        self.client._sessions.discard(self)
        try:
            await self._close_on_server()
        except E.LockdError:
            if not lost:
                raise

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    # -- primitives ----------------------------------------------------------

    def mutex(self, name: str, *, value: bytes = b"", lock_delay: float = 0.0, max_hold: float = 0.0):
        """An exclusive lock; max_hold (1 s to 720 h) asks the server to end each
        hold after it even while the session lives (check() raises HoldExpired
        before)."""
        from .locks import Mutex
        return Mutex(self, name, value=value, lock_delay=lock_delay, max_hold=max_hold)

    def semaphore(self, name: str, permits: int, *, value: bytes = b""):
        from .locks import Semaphore
        return Semaphore(self, name, permits, value=value)

    def rwmutex(self, name: str, *, value: bytes = b""):
        from .locks import RWMutex
        return RWMutex(self, name, value=value)

    def multi_lock(self, names, *, value: bytes = b""):
        """Exclusive locks on names (2 to 32, distinct), taken all at once or not at all."""
        from .multilock import MultiLock
        return MultiLock(self, names, value=value)

    def election(self, name: str):
        from .locks import Election
        return Election(self, name)


def random_jitter(d: float) -> float:
    import random
    return random.uniform(0, d)


async def create(client, ttl: float, owner: Optional[str], on_deadline) -> Session:
    """Creates a session: the lease counts from the first attempt's send time
    (a retry may be answered with the session that attempt created)."""
    if not 1.0 <= ttl <= 3600.0:
        raise E.InvalidArgument(f"ttl {ttl}s outside [1s, 1h]")
    owner = owner or default_owner()
    t = client._t
    for _ in range(3):
        sent = time.monotonic()
        # 256 random bits, made once so that a resend presents the same secret.
        secret = secrets.token_hex(32)
        msg = pb.CreateSessionRequest(ttl=_dur(ttl), owner=owner, request_id=secrets.token_hex(16), secret=secret)
        dl = lease_deadline(sent, ttl)
        resp = await t.call("LockService", "CreateSession", msg, pb.CreateSessionResponse, idempotent=True,
                            timeout=dl - sent)
        granted = resp.ttl.ToNanoseconds() / 1e9 if resp.HasField("ttl") else ttl
        if time.monotonic() < lease_deadline(sent, granted or ttl):
            s = Session(client, resp.session_id, resp.secret or secret, granted or ttl, owner, sent, on_deadline)
            client._sessions.add(s)
            return s
        # Confirmed after its own client deadline: close it and ask again.
        try:
            await t.call("LockService", "CloseSession",
                         pb.CloseSessionRequest(session_id=resp.session_id, seq=1, secret=resp.secret or secret),
                         pb.CloseSessionResponse, idempotent=True)
        except E.LockdError:
            pass
    raise E.Unavailable("create session: every session was confirmed after its client deadline")
