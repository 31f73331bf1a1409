"""A thin synchronous wrapper of the asyncio client.

It runs the asyncio client on an event loop in a background thread (which
also runs the keepalives), and blocks the calling thread on each call:

    from lockd.sync import Client
    with Client("http://127.0.0.1:7070") as c, c.session(ttl=10) as s, s.mutex("job") as m:
        ...  # m.token is the fencing token
"""

from __future__ import annotations

import asyncio
import threading
from typing import Iterator, Optional

from . import client as _client
from . import session as _session


class _Loop:
    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="lockd", daemon=True)
        self.thread.start()

    def run(self, coro, timeout: Optional[float] = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


async def _make(cls, *a, **kw):
    return cls(*a, **kw)


class Client:
    """The synchronous client; arguments as lockd.Client."""

    def __init__(self, endpoints=None, **kw):
        self._l = _Loop()
        self._c: _client.Client = self._l.run(_make(_client.Client, endpoints, **kw))

    @property
    def aio(self) -> _client.Client:
        """The asyncio client underneath."""
        return self._c

    def session(self, ttl: float = 10.0, owner: Optional[str] = None, on_deadline=None) -> "Session":
        return Session(self._l, self._l.run(self._c.session(ttl, owner, on_deadline)))

    def check_token(self, name: str, token: int):
        return self._l.run(self._c.check_token(name, token))

    def leader(self, name: str):
        return self._l.run(self._c.leader(name))

    def watch(self, prefix: str, from_position: str = "", state: bool = False) -> Iterator:
        return self._iter(self._c.watch(prefix, from_position, state))

    def observe(self, name: str) -> Iterator:
        return self._iter(self._c.observe(name))

    def _iter(self, agen):
        try:
            while True:
                try:
                    yield self._l.run(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._l.run(agen.aclose())

    def close(self):
        try:
            self._l.run(self._c.close())
        finally:
            self._l.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Session:
    """A session (see lockd.Session); ``with`` closes it."""

    def __init__(self, loop: _Loop, s: _session.Session):
        self._l, self.aio = loop, s

    id = property(lambda self: self.aio.id)
    ttl = property(lambda self: self.aio.ttl)
    owner = property(lambda self: self.aio.owner)
    deadline = property(lambda self: self.aio.deadline)
    err = property(lambda self: self.aio.err)

    def on_lost(self, cb):
        """Calls cb(error) (on the client's thread) when the session ends."""
        self._l.loop.call_soon_threadsafe(self.aio.on_lost, cb)

    def close(self):
        self._l.run(self.aio.close())

    def mutex(self, name: str, **kw) -> "Lock":
        return Lock(self._l, self.aio.mutex(name, **kw))

    def semaphore(self, name: str, permits: int, **kw) -> "Lock":
        return Lock(self._l, self.aio.semaphore(name, permits, **kw))

    def rwmutex(self, name: str, **kw) -> "Lock":
        return Lock(self._l, self.aio.rwmutex(name, **kw))

    def multi_lock(self, names, **kw) -> "Lock":
        return Lock(self._l, self.aio.multi_lock(names, **kw))

    def election(self, name: str) -> "Lock":
        return Lock(self._l, self.aio.election(name))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Lock:
    """Wraps a Mutex, Semaphore, RWMutex or Election: every coroutine method
    of it becomes a blocking one; ``with`` locks (acquires) and unlocks."""

    def __init__(self, loop: _Loop, obj):
        self._l, self.aio = loop, obj

    def __getattr__(self, name):
        v = getattr(self.aio, name)
        if asyncio.iscoroutinefunction(v):
            return lambda *a, **kw: self._l.run(v(*a, **kw))
        return v

    def __enter__(self):
        self._l.run(self.aio.__aenter__())
        return self

    def __exit__(self, *exc):
        self._l.run(self.aio.__aexit__(*exc))


__all__ = ["Client", "Session", "Lock"]
