"""Transport: endpoints, gRPC channels and the retry loop every call uses.

The rules follow the Go client (the reference implementation): a call goes
to the endpoint that answered last or that a server named as leader; a
NOT_LEADER/NO_LEADER answer is retried (the node did not take the request),
at once on the leader the error's ErrorDetail.leader_api names; an unknown
outcome (OUTCOME_UNKNOWN, a timed-out attempt, a broken connection) is
retried only for requests the server deduplicates (reads, and mutations
carrying a request id or a session seq); any other reason is final. Between
attempts: exponential backoff with full jitter (50 ms base, 2 s cap), at most
200 ms while a node says an election is under way; a call without its own
deadline gives up after the retry timeout. Every answer's cluster id is
checked: an endpoint of another cluster is never used again.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Callable, Optional
from urllib.parse import urlparse

import grpc

from . import errors as E
from ._pb import lockd_pb2 as pb
from ._stream import BODY, KAScheduler, NoStream, StreamCallError, open_stream, stream_error

R = pb.ErrorReason
CLUSTER_HEADER = "lockd-cluster-id"
SILENT_FOR = 10.0  # an endpoint that did not answer is passed over this long
MAX_ENDPOINTS = 32
MIN_ATTEMPT = 0.010
BACKOFF_BASE, BACKOFF_CAP = 0.050, 2.0
ELECTION_POLL = 0.200

_CHANNEL_OPTIONS = [
    # A restarted node must be reachable again within a keepalive, not
    # after grpc's default reconnect backoff (up to two minutes).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
]


def normalize(url: str) -> str:
    """Returns url as the client keys endpoints: scheme://host:port."""
    if "://" not in url:
        url = "http://" + url
    u = urlparse(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise E.InvalidArgument(f"endpoint {url!r}: want http(s)://host:port")
    port = u.port or (443 if u.scheme == "https" else 80)
    host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
    return f"{u.scheme}://{host}:{port}"


class Endpoint:
    """One server the client may call."""

    def __init__(self, url: str, creds: Optional[grpc.ChannelCredentials]):
        self.url = url
        u = urlparse(url)
        self.target = u.netloc
        self.tls = u.scheme == "https"
        self._creds = creds
        self.channel: Optional[grpc.aio.Channel] = None
        self.methods: dict = {}
        self.refused = False  # answered for another cluster
        self.silent_until = 0.0
        self.stream = None  # the open session stream (_stream.Stream)
        self.opening = None  # a future while a stream is being opened
        self.unary_until = 0.0  # the node took no stream: unary until then

    def ensure(self) -> grpc.aio.Channel:
        if self.channel is None:
            if self.tls:
                creds = self._creds or grpc.ssl_channel_credentials()
                self.channel = grpc.aio.secure_channel(self.target, creds, options=_CHANNEL_OPTIONS)
            else:
                self.channel = grpc.aio.insecure_channel(self.target, options=_CHANNEL_OPTIONS)
        return self.channel

    def unary(self, path: str, resp_cls):
        mc = self.methods.get(path)
        if mc is None:
            mc = self.ensure().unary_unary(path, request_serializer=_ser, response_deserializer=resp_cls.FromString)
            self.methods[path] = mc
        return mc

    async def close(self):
        st = self.stream
        if st is not None:
            st.fail("client closed")
            st.reader.cancel()
            await asyncio.gather(st.reader, return_exceptions=True)
        if self.channel is not None:
            ch, self.channel, self.methods = self.channel, None, {}
            await ch.close()


def _ser(m) -> bytes:
    return m.SerializeToString()


def _not_sent(e: grpc.aio.AioRpcError) -> bool:
    """Whether the request surely never reached a server."""
    s = (e.details() or "") + (e.debug_error_string() or "")
    return e.code() == grpc.StatusCode.UNAVAILABLE and (
        "failed to connect" in s.lower() or "connection refused" in s.lower())


def _retryable(e: grpc.aio.AioRpcError, d: Optional[pb.ErrorDetail], idempotent: bool, timed_out: bool):
    hint = d.leader_api if d is not None else ""
    if d is not None and d.reason != R.ERROR_REASON_UNSPECIFIED:
        if d.reason in (R.ERROR_REASON_NOT_LEADER, R.ERROR_REASON_NO_LEADER):
            return True, hint
        if d.reason == R.ERROR_REASON_OUTCOME_UNKNOWN:
            return idempotent, hint
        return False, hint
    if timed_out:
        return idempotent, hint
    if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN,
                    grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        return idempotent or _not_sent(e), hint
    return False, hint


class Transport:
    """The endpoints of one client and the retry loop."""

    def __init__(self, endpoints, token: str = "", creds=None,
                 request_timeout: float = 5.0, retry_timeout: float = 30.0, stream: bool = True):
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        if not endpoints:
            endpoints = ["http://127.0.0.1:7070"]
        self.creds = creds
        self.eps = [Endpoint(normalize(u.strip()), creds) for u in endpoints]
        self.cur = random.randrange(len(self.eps))
        self.cluster_id = ""
        self.metadata = (("authorization", "Bearer " + token),) if token else None
        self.request_timeout = request_timeout
        self.retry_timeout = retry_timeout
        self.closed = False
        self.stream_on = stream
        self.ka = KAScheduler(self)

    async def close(self):
        self.closed = True
        await self.ka.close()
        for ep in self.eps:
            await ep.close()

    def pick(self):
        now = time.monotonic()
        best, best_at, usable = None, 0, 0
        n = len(self.eps)
        for i in range(n):
            at = (self.cur + i) % n
            ep = self.eps[at]
            if ep.refused:
                continue
            usable += 1
            if best is None or (best.silent_until > now and (ep.silent_until <= now or ep.silent_until < best.silent_until)):
                best, best_at = ep, at
        if best is None:
            raise E.ClusterMismatch(f"every endpoint answered for a cluster other than {self.cluster_id}")
        self.cur = best_at
        return best, usable > 1

    def follow(self, frm: Endpoint, hint: str) -> bool:
        try:
            u = normalize(hint)
        except E.LockdError:
            return False
        if u == frm.url:
            return False
        for i, ep in enumerate(self.eps):
            if ep.url == u:
                if ep.refused:
                    return False
                self.cur, ep.silent_until = i, 0.0
                return True
        if len(self.eps) >= MAX_ENDPOINTS:
            return False
        self.eps.append(Endpoint(u, self.creds))
        self.cur = len(self.eps) - 1
        return True

    def rotate(self, ep: Endpoint):
        if self.eps[self.cur] is ep:
            self.cur = (self.cur + 1) % len(self.eps)

    def check_cluster(self, ep: Endpoint, cid: str):
        if not cid:
            return
        if not self.cluster_id:
            self.cluster_id = cid
            return
        if cid != self.cluster_id:
            ep.refused = True
            raise E.ClusterMismatch(f"{ep.url} answered for cluster {cid}, not {self.cluster_id}")

    async def call(self, service: str, method: str, req, resp_cls, *, idempotent: bool, name: str = "",
                   timeout: Optional[float] = None, poll: float = 0.0, deadline: Optional[float] = None,
                   until: Optional[Callable[[], float]] = None, once: bool = False):
        """Calls service/method with req under the retry rules and returns the answer.

        deadline (time.monotonic) bounds the whole call (Deadline when it
        passes); until bounds each attempt's request part (a lease deadline);
        poll is a long poll the server may block for, added to each attempt.
        """
        if self.closed:
            raise E.ClientClosed("client closed")
        path = f"/lockd.v1.{service}/{method}"
        start = time.monotonic()
        attempt, followed = 0, False
        while True:
            ep, others = self.pick()
            now = time.monotonic()
            t = self.request_timeout if timeout is None else min(self.request_timeout, timeout)
            if until is not None:
                t = min(t, until() - now)
            if deadline is not None and others:
                t = min(t, (deadline - now) / 2)
            t = max(t, MIN_ATTEMPT) + poll
            if deadline is not None:
                t = min(t, max(deadline - now, MIN_ATTEMPT))
            try:
                resp, cid = await self._attempt(ep, service, method, path, req, resp_cls, t)
            except (grpc.aio.AioRpcError, StreamCallError) as e:
                if deadline is not None and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and \
                        time.monotonic() >= deadline:
                    # The caller's time ran out, not the node's: it stays usable.
                    raise E.Deadline(f"timed out at {ep.url}") from None
                d = E.error_detail(e)
                cid = d.cluster_id if d is not None else ""
                if not cid:
                    cid = _md(e.trailing_metadata()) or _md(e.initial_metadata())
                try:
                    self.check_cluster(ep, cid)
                except E.ClusterMismatch as cm:
                    err, ok, hint, immediate = cm, True, "", True
                else:
                    timed_out = e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                    if timed_out and method == "KeepAliveBatch" and ep.stream is not None:
                        # An overdue keepalive: the node may be frozen. Drop its
                        # stream so the next round opens one (or moves on).
                        ep.stream.fail("keepalive overdue")
                    if timed_out or (d is None and e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN)):
                        ep.silent_until = time.monotonic() + SILENT_FOR
                    else:
                        ep.silent_until = 0.0
                    ok, hint = _retryable(e, d, idempotent, timed_out)
                    err = E.from_rpc(e, name)
                    if timed_out and not isinstance(err, E.Unavailable):
                        err = E.Unavailable(f"attempt timed out after {t:.3f}s at {ep.url}")
                    immediate = False
                    if hint:
                        immediate = self.follow(ep, hint) and not followed
                    elif ok:
                        self.rotate(ep)
                if not ok:
                    raise err from None
                followed = bool(hint) and immediate
                if once and not (immediate and attempt == 0):
                    raise err from None
                attempt += 1
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise E.Deadline(f"timed out; last error: {err}") from None
                if deadline is None and now - start >= self.retry_timeout:
                    raise err from None
                if until is not None and now >= until():
                    raise err from None
                if immediate:
                    continue
                wait = random.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2 ** attempt))
                if d is not None and not d.leader_api and d.reason in (R.ERROR_REASON_NOT_LEADER, R.ERROR_REASON_NO_LEADER):
                    wait = min(wait, ELECTION_POLL)
                if deadline is not None:
                    wait = min(wait, max(deadline - now, 0))
                await asyncio.sleep(wait)
                continue
            ep.silent_until = 0.0
            self.check_cluster(ep, cid)
            return resp

    async def _attempt(self, ep: Endpoint, service: str, method: str, path: str, req, resp_cls, t: float):
        """One attempt on ep: over its session stream when the method has a
        stream form and streams are on, else unary. Returns (answer, cluster id)."""
        body = BODY.get(method) if service == "LockService" else None
        if method == "KeepAliveBatch":
            body = "keep_alive"
        if body is not None and self.stream_on:
            try:
                st = ep.stream
                if st is None:  # an open stream is used as is: no coroutine for the lookup
                    st = await open_stream(ep, self.metadata, t)
                if method == "Acquire":
                    gate = st.acquires
                    if not gate.try_enter():
                        await gate.enter()
                    try:
                        r = await st.send(pb.StreamRequest(acquire=req), t)
                    finally:
                        gate.leave()
                else:
                    r = await st.send(pb.StreamRequest(**{body: req}), t)
                if r.WhichOneof("body") == "error":
                    raise stream_error(r.error)
                return getattr(r, body), r.cluster_id
            except NoStream:
                pass
            except asyncio.TimeoutError:
                raise StreamCallError(grpc.StatusCode.DEADLINE_EXCEEDED, f"opening a stream to {ep.url} timed out") from None
        if method == "KeepAliveBatch":
            return None, ""
        call = ep.unary(path, resp_cls)(req, timeout=t, metadata=self.metadata)
        resp = await call
        return resp, getattr(resp, "cluster_id", "") or _md(await call.initial_metadata())

    async def call_stream_keepalive(self, frame, timeout: float, until):
        """Sends one KeepAliveBatch (one attempt, and an immediate one on
        another endpoint after a leader hint); None when no stream can be used."""
        return await self.call("SessionService", "KeepAliveBatch", frame, None, idempotent=True, once=True,
                               timeout=timeout, until=until)


def _md(md) -> str:
    for k, v in md or ():
        if k == CLUSTER_HEADER:
            return v
    return ""
