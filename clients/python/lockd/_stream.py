"""The session stream (SessionService.Stream) and batched keepalives.

One bidirectional gRPC stream per endpoint carries the session-scoped calls
(CreateSession, Acquire, Release, Cancel, Complete, CloseSession) and
KeepAliveBatch frames, matched to their answers by call_id. The server
first sends a frame with call_id 0 (the stream is open). A stream is
transport, never a lease: when it breaks, every call in flight on it has an
unknown outcome and is resent (same seq, same request id) by the retry loop,
on a new stream or unary. When a node does not take streams (an error other
than a connection failure on opening), the client uses unary calls to it
for a minute.

Keepalives: a client-wide scheduler keeps each session's next due time; at
the earliest one it sends one KeepAliveBatch naming every session due
within half a renew interval (renewing early only moves a deadline from an
earlier send time), at most 1000 sessions and 60 KiB a frame (the server
reads at most 64 KiB a frame). Each session's lease is confirmed at the
batch's send time.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from dataclasses import dataclass
from typing import Optional

import grpc

from ._pb import lockd_pb2 as pb

UNARY_FOR = 60.0
MAX_BATCH = 1000
MAX_BATCH_BYTES = 60 << 10
MAX_STREAM_ACQUIRES = 128

# The StreamRequest/StreamResponse body field of each method with a stream form.
BODY = {"CreateSession": "create_session", "Acquire": "acquire", "Release": "release", "Cancel": "cancel",
        "Complete": "complete", "CloseSession": "close_session"}

_CODES = {c.value[0]: c for c in grpc.StatusCode}


class Gate:
    """At most n holders at once, FIFO: asyncio.Semaphore without a
    coroutine per pass when it is free (the common case on a stream)."""

    def __init__(self, n: int):
        self.free = n
        self.waiters: collections.deque = collections.deque()

    def try_enter(self) -> bool:
        """Takes a place if one is free and nobody waits (no await)."""
        if self.free > 0 and not self.waiters:
            self.free -= 1
            return True
        return False

    async def enter(self):
        if self.try_enter():
            return
        f = asyncio.get_running_loop().create_future()
        self.waiters.append(f)
        try:
            await f  # leave() passed its place to us
        except asyncio.CancelledError:
            if f.done() and not f.cancelled():
                self.leave()  # handed a place as it was cancelled: pass it on
            else:
                try:
                    self.waiters.remove(f)
                except ValueError:
                    pass
            raise

    def leave(self):
        while self.waiters:
            f = self.waiters.popleft()
            if not f.done():
                f.set_result(None)
                return
        self.free += 1


class NoStream(Exception):
    """No stream to this endpoint: call unary."""


class StreamCallError(grpc.RpcError):
    """A call's error on a stream (StreamError), or the stream broke; it reads
    like a grpc.aio.AioRpcError to the retry loop."""

    def __init__(self, code: grpc.StatusCode, message: str, detail: Optional[pb.ErrorDetail] = None):
        super().__init__(message)
        self._code, self._message, self._detail = code, message, detail

    def code(self):
        return self._code

    def details(self):
        return self._message

    def debug_error_string(self):
        return self._message

    def trailing_metadata(self):
        return ()

    def initial_metadata(self):
        return ()


class Stream:
    """One open session stream to an endpoint.

    Per call: one future (what the caller awaits) and one write; no timer
    per call. Each call's deadline is kept beside its future, and one
    timer per stream fires at the earliest deadline, fails every call
    past its own, and is set again for the next (a call whose deadline is
    earlier than the armed one re-arms it). That keeps the per-call rule
    (no answer within the timeout: DEADLINE_EXCEEDED) without a timer
    handle per frame.
    """

    def __init__(self, ep, call):
        self.ep, self.call = ep, call
        self.ids = itertools.count(1)
        self.pending: dict[int, tuple] = {}  # call_id -> (future, deadline, timeout)
        self.writing = Gate(1)  # grpc takes one write at a time
        self.acquires = Gate(MAX_STREAM_ACQUIRES)
        self.broken: Optional[str] = None
        self.loop = asyncio.get_running_loop()
        self.timer: Optional[asyncio.TimerHandle] = None
        self.timer_at = 0.0
        self.reader = self.loop.create_task(self._read())

    async def _read(self):
        why = "stream ended"
        pending, read = self.pending, self.call.read
        try:
            while True:
                r = await read()
                if r is grpc.aio.EOF:
                    break
                p = pending.pop(r.call_id, None)
                if p is not None and not p[0].done():
                    p[0].set_result(r)
        except grpc.aio.AioRpcError as e:
            why = f"{e.code().name}: {e.details()}"
        except asyncio.CancelledError:
            why = "stream closed"
        except Exception as e:  # noqa: BLE001 - any failure ends the stream, never silently
            why = f"{type(e).__name__}: {e}"
        self.fail(why)

    def fail(self, why: str):
        if self.broken is None:
            self.broken = why
        if self.ep.stream is self:
            self.ep.stream = None
        self.call.cancel()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        for f, _, _ in self.pending.values():
            if not f.done():
                f.set_exception(StreamCallError(grpc.StatusCode.UNAVAILABLE,
                                                f"session stream to {self.ep.url} broke; outcome unknown: {why}"))
        self.pending.clear()

    def _expire(self):
        """The timer: fails each call past its deadline, re-arms for the next."""
        self.timer = None
        now = self.loop.time()
        first = None
        for cid, (f, at, timeout) in list(self.pending.items()):
            if at <= now:
                del self.pending[cid]
                if not f.done():
                    f.set_exception(StreamCallError(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"no answer on the session stream to {self.ep.url} within {timeout:.3f}s"))
            elif first is None or at < first:
                first = at
        if first is not None:
            self._arm(first)

    def _arm(self, at: float):
        if self.timer is not None:
            if self.timer_at <= at:
                return
            self.timer.cancel()
        self.timer_at = at
        self.timer = self.loop.call_at(at, self._expire)

    async def send(self, req: pb.StreamRequest, timeout: float) -> pb.StreamResponse:
        if self.broken is not None:
            raise StreamCallError(grpc.StatusCode.UNAVAILABLE, f"session stream to {self.ep.url} broke: {self.broken}")
        cid = next(self.ids)
        req.call_id = cid
        loop = self.loop
        f = loop.create_future()
        at = loop.time() + timeout
        self.pending[cid] = (f, at, timeout)
        if self.timer is None or at < self.timer_at:
            self._arm(at)
        try:
            w = self.writing
            if not w.try_enter():
                await w.enter()
            try:
                await self.call.write(req)
            finally:
                w.leave()
            return await f
        except (grpc.aio.AioRpcError, grpc.aio.UsageError) as e:
            self.fail(str(e))
            raise StreamCallError(grpc.StatusCode.UNAVAILABLE, f"session stream to {self.ep.url} broke: {e}") from None
        finally:
            self.pending.pop(cid, None)


async def open_stream(ep, metadata, timeout: float) -> Stream:
    """Returns ep's stream, opening it if needed; NoStream when the node
    does not take streams (then unary for a minute)."""
    if ep.stream is not None:
        return ep.stream
    if time.monotonic() < ep.unary_until:
        raise NoStream()
    if ep.opening is not None:
        await asyncio.wait_for(asyncio.shield(ep.opening), timeout)
        if ep.stream is not None:
            return ep.stream
        raise NoStream()
    ep.opening = asyncio.get_running_loop().create_future()
    try:
        mc = ep.ensure().stream_stream("/lockd.v1.SessionService/Stream",
                                       request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=pb.StreamResponse.FromString)
        call = mc(metadata=metadata)
        try:
            hello = await asyncio.wait_for(call.read(), timeout)
        except asyncio.TimeoutError:
            call.cancel()
            raise StreamCallError(grpc.StatusCode.UNAVAILABLE,
                                  f"open session stream to {ep.url}: no answer within {timeout:.3f}s") from None
        except grpc.aio.AioRpcError as e:
            call.cancel()
            if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                            grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                            grpc.StatusCode.RESOURCE_EXHAUSTED):
                raise
            ep.unary_until = time.monotonic() + UNARY_FOR
            raise NoStream() from None
        if hello is grpc.aio.EOF:
            ep.unary_until = time.monotonic() + UNARY_FOR
            raise NoStream()
        st = Stream(ep, call)
        st.cluster_id = hello.cluster_id
        ep.stream = st
        return st
    finally:
        f, ep.opening = ep.opening, None
        f.set_result(None)


def stream_error(e: pb.StreamError) -> StreamCallError:
    return StreamCallError(_CODES.get(e.code, grpc.StatusCode.UNKNOWN), e.message,
                           e.detail if e.HasField("detail") else None)


@dataclass
class KAResult:
    sent: float = 0.0
    ttl: float = 0.0
    err: Optional[Exception] = None
    unary: bool = False


def split_batch(batch: list) -> list[list]:
    frames = []
    while batch:
        n, size = 0, 0
        while n < len(batch) and n < MAX_BATCH:
            e = len(batch[n].id) + len(batch[n]._secret) + 12
            if n > 0 and size + e > MAX_BATCH_BYTES:
                break
            size += e
            n += 1
        frames.append(batch[:n])
        batch = batch[n:]
    return frames


class KAScheduler:
    """Renews the sessions of one client in batches over the session stream."""

    def __init__(self, transport):
        self.t = transport
        self.due: dict = {}  # session -> (due time, future)
        self.wake = asyncio.Event()
        self.task: Optional[asyncio.Task] = None

    def schedule(self, s, due: float) -> asyncio.Future:
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._run())
        f = asyncio.get_running_loop().create_future()
        self.due[s] = (due, f)
        self.wake.set()
        return f

    def unschedule(self, s):
        v = self.due.pop(s, None)
        if v is not None and not v[1].done():
            v[1].cancel()

    async def close(self):
        for _, f in self.due.values():
            f.cancel()
        self.due.clear()
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def _run(self):
        from .session import renew_interval
        while True:
            first = min((d for d, _ in self.due.values()), default=None)
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), None if first is None else max(0.0, first - time.monotonic()))
                continue
            except asyncio.TimeoutError:
                pass
            now = time.monotonic()
            batch = [s for s, (d, _) in self.due.items() if d <= now + renew_interval(s.ttl) / 2]
            futs = [self.due.pop(s)[1] for s in batch]
            for frame, fs in zip(split_batch(batch), _chunks(futs, batch)):
                asyncio.get_running_loop().create_task(self._send(frame, fs, now))

    async def _send(self, batch, futs, sent: float):
        from .session import keepalive_timeout
        ttl = min(s.ttl for s in batch)
        until = min(s.deadline for s in batch)
        frame = pb.KeepAliveBatch(sessions=[pb.KeepAliveRequest(session_id=s.id, secret=s._secret) for s in batch])
        res = [KAResult(sent=sent) for _ in batch]
        try:
            r = await self.t.call_stream_keepalive(frame, timeout=keepalive_timeout(ttl, self.t.request_timeout),
                                                   until=lambda: until)
            if r is None:
                for x in res:
                    x.unary = True
            elif len(r.results) != len(batch):
                raise StreamCallError(grpc.StatusCode.INTERNAL, "keepalive batch: malformed answer")
            else:
                for x, s, kr in zip(res, batch, r.results):
                    if kr.session_id != s.id:
                        x.err = StreamCallError(grpc.StatusCode.INTERNAL, "keepalive batch: answer names another session")
                    elif kr.HasField("error"):
                        x.err = stream_error(kr.error)
                    else:
                        x.ttl = kr.ttl.ToNanoseconds() / 1e9 if kr.HasField("ttl") else 0.0
        except Exception as e:  # noqa: BLE001 - every session gets the round's outcome
            for x in res:
                x.err = e
        for f, x in zip(futs, res):
            if not f.done():
                f.set_result(x)


def _chunks(futs, batch):
    out, i = [], 0
    for frame in split_batch(list(batch)):
        out.append(futs[i:i + len(frame)])
        i += len(frame)
    return out
