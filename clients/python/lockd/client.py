"""The asyncio client: sessions, fencing-token checks, watch and observe."""

from __future__ import annotations

import asyncio
import os
import random
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Optional

import grpc

from . import errors as E
from ._pb import lockd_pb2 as pb
from ._rpc import Transport, _md
from .session import Session, create

WATCH_IDLE = 40.0  # a watch that hears nothing (not even a server keepalive) this long reconnects


@dataclass(frozen=True)
class Event:
    """One lock event of a watch (kind is a lockd.v1.EventKind name without prefix, lowercased)."""

    position: str
    kind: str
    name: str
    session: str
    owner: str
    token: int
    shared: bool
    limit: int
    value: bytes
    entry_end: bool


@dataclass(frozen=True)
class Leader:
    session_id: str
    owner: str
    value: bytes
    token: int


def _kind(k: int) -> str:
    return pb.EventKind.Name(k).removeprefix("EVENT_KIND_").lower() if k in pb.EventKind.values() else str(k)


class Client:
    """A connection to a lockd cluster through one or more endpoints.

    ``endpoints``: URLs (``http://host:port``) or a comma-separated string;
    default ``$LOCKD_ENDPOINTS`` or http://127.0.0.1:7070. ``token``: bearer
    token (default ``$LOCKD_TOKEN``). ``root_certificates``/``private_key``/
    ``certificate_chain`` (PEM bytes) for https endpoints and client
    certificates. ``request_timeout`` bounds one attempt (5 s),
    ``retry_timeout`` a call without its own timeout (30 s). ``stream``: carry
    session calls and batched keepalives over one session stream per endpoint
    (default on; ``LOCKD_STREAM=off`` makes every call unary).
    """

    def __init__(self, endpoints=None, *, token: Optional[str] = None, request_timeout: float = 5.0,
                 retry_timeout: float = 30.0, root_certificates: Optional[bytes] = None,
                 private_key: Optional[bytes] = None, certificate_chain: Optional[bytes] = None,
                 stream: Optional[bool] = None):
        if endpoints is None:
            endpoints = os.environ.get("LOCKD_ENDPOINTS", "")
        if token is None:
            token = os.environ.get("LOCKD_TOKEN", "")
        creds = None
        if root_certificates or certificate_chain:
            creds = grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)
        if stream is None:
            stream = os.environ.get("LOCKD_STREAM", "") not in ("off", "0", "false")
        self._t = Transport(endpoints, token, creds, request_timeout, retry_timeout, stream)
        self._sessions: set[Session] = set()

    @property
    def cluster_id(self) -> str:
        return self._t.cluster_id

    async def session(self, ttl: float = 10.0, owner: Optional[str] = None,
                      on_deadline: Optional[Callable[[float], None]] = None) -> Session:
        """Creates a session (a lease kept alive in the background).
        on_deadline(t) is called each time the client deadline (time.monotonic) moves."""
        if self._t.closed:
            raise E.ClientClosed("client closed")
        return await create(self, ttl, owner, on_deadline)

    async def close(self):
        """Closes every session (releasing their locks) and the connections."""
        await asyncio.gather(*(s.close() for s in list(self._sessions)), return_exceptions=True)
        await self._t.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def check_token(self, name: str, token: int) -> pb.CheckTokenResponse:
        """Whether token is a current grant of lock name (linearizable)."""
        return await self._t.call("LockService", "CheckToken", pb.CheckTokenRequest(name=name, token=token),
                                  pb.CheckTokenResponse, idempotent=True, name=name)

    async def describe(self, name: str) -> Optional[pb.LockInfo]:
        r = await self._t.call("LockService", "DescribeLock", pb.DescribeLockRequest(name=name),
                               pb.DescribeLockResponse, idempotent=True, name=name)
        return r.lock if r.HasField("lock") else None

    async def status(self) -> pb.StatusResponse:
        return await self._t.call("LockService", "Status", pb.StatusRequest(), pb.StatusResponse, idempotent=True)

    async def leader(self, name: str) -> Leader:
        info = await self.describe(name)
        for h in info.holders if info else ():
            return Leader(h.session_id, h.owner, h.value, h.token)
        raise E.NoLeader(f"election {name!r} has no leader")

    async def watch(self, prefix: str, from_position: str = "", state: bool = False) -> AsyncIterator[Event]:
        """Yields every event of the locks under prefix, after from_position
        (or from now), resuming after a broken stream without loss. A reset
        (events were lost) is yielded as an Event of kind "reset"."""
        cursor, attempt = from_position, 0
        while True:
            if self._t.closed:
                raise E.ClientClosed("client closed")
            ep = self._t.eps[(self._t.cur + attempt) % len(self._t.eps)]
            mc = ep.ensure().unary_stream("/lockd.v1.WatchService/Watch",
                                          request_serializer=lambda m: m.SerializeToString(),
                                          response_deserializer=pb.WatchResponse.FromString)
            call = mc(pb.WatchRequest(prefix=prefix, state=state, **{"from": cursor}), metadata=self._t.metadata)
            got = False
            try:
                self._t.check_cluster(ep, _md(await call.initial_metadata()))
                it = call.__aiter__()
                while True:
                    try:
                        m = await asyncio.wait_for(it.__anext__(), WATCH_IDLE)
                    except StopAsyncIteration:
                        break
                    got = True
                    if m.kind == pb.EVENT_KIND_UNSPECIFIED:
                        if m.position:
                            cursor = m.position  # a server keepalive: where the stream is
                        continue
                    if not (state and m.kind in (pb.EVENT_KIND_HELD, pb.EVENT_KIND_RESET)):
                        cursor = m.position
                    yield Event(m.position, _kind(m.kind), m.name, m.session, m.owner, m.token,
                                m.mode == pb.MODE_SHARED, m.limit, m.value, m.entry_end)
            except grpc.aio.AioRpcError as e:
                if e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED,
                                grpc.StatusCode.PERMISSION_DENIED):
                    raise E.from_rpc(e) from None
            except (asyncio.TimeoutError, E.ClusterMismatch):
                pass
            finally:
                call.cancel()
            attempt = 0 if got else attempt + 1
            await asyncio.sleep(random.uniform(0, min(2.0, 0.05 * 2 ** min(attempt, 6))))

    async def observe(self, name: str) -> AsyncIterator[Optional[Leader]]:
        """Yields the leader of election name (None while there is none)
        each time it changes, starting with the current one."""
        nxt: Optional[Leader] = None
        last, yielded, synced = None, False, False
        async for ev in self.watch(name, state=True):
            if ev.name != name and ev.kind not in ("reset", "synced"):
                continue
            if ev.kind == "reset":
                synced, nxt = False, None
                continue
            if ev.kind in ("held", "granted"):
                nxt = Leader(ev.session, ev.owner, ev.value, ev.token)
            elif ev.kind == "value_changed":
                if nxt is not None and ev.token == nxt.token:
                    nxt = Leader(nxt.session_id, nxt.owner, ev.value, nxt.token)
            elif ev.kind in ("released", "expired", "force_released", "completed"):
                if nxt is not None and ev.token == nxt.token:
                    nxt = None
            elif ev.kind == "synced":
                synced = True
            else:
                continue
            if not synced or (ev.kind != "synced" and not ev.entry_end) or (yielded and nxt == last):
                continue
            last, yielded = nxt, True
            yield nxt
