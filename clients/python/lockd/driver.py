"""Conformance driver (protocol v1, conformance/DRIVER.md) for the Python client.

Run it as ``python3 -m lockd.driver`` (or ``clients/python/driver.py``).

The conformance suite starts it with LOCKD_ENDPOINTS (and optionally
LOCKD_TOKEN), writes one JSON request per line on stdin and reads one JSON
answer or event per line on stdout. Requests run concurrently; every answer
carries the request's id and the call's start and end times (t0, t1, Unix ns).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import lockd
from lockd import errors as E

CAPABILITIES = ["semaphore", "rwlock", "election", "observe", "complete", "watch", "check_token", "multilock", "max_hold"]


class Fail(Exception):
    def __init__(self, code: str, message: str, holder: str = ""):
        super().__init__(message)
        self.code, self.holder = code, holder


class Driver:
    def __init__(self):
        self.client = lockd.Client(os.environ.get("LOCKD_ENDPOINTS", ""), token=os.environ.get("LOCKD_TOKEN", ""))
        self.sessions: dict[str, lockd.Session] = {}
        self.locks: dict = {}  # handle -> (kind, object)
        self.elections: dict[str, lockd.Election] = {}
        self.streams: dict[str, asyncio.Task] = {}
        self.tasks: set[asyncio.Task] = set()

    def emit(self, obj: dict):
        sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
        sys.stdout.flush()

    def session(self, req) -> lockd.Session:
        s = self.sessions.get(req.get("session", ""))
        if s is None:
            raise Fail("not_found", f"no session {req.get('session')!r}")
        return s

    def lock(self, req):
        v = self.locks.get(req.get("lock", ""))
        if v is None:
            raise Fail("not_found", f"no lock {req.get('lock')!r}")
        return v

    @staticmethod
    def timeout(req):
        ms = req.get("timeout_ms")
        return ms / 1000 if ms else None  # absent or 0: no timeout of the suite's

    async def handle(self, req: dict):
        rid = req.get("id")
        t0 = time.time_ns()
        try:
            res = await getattr(self, "op_" + str(req.get("op")), self.op_unknown)(req)
            out = {"id": rid, "ok": True, **(res or {})}
        except Fail as f:
            out = {"id": rid, "ok": False, "error": {"code": f.code, "message": str(f), "holder": f.holder}}
        except E.Busy as b:
            holder = b.holders[0].owner if b.holders else ""
            out = {"id": rid, "ok": False, "error": {"code": "busy", "message": str(b), "holder": holder}}
        except E.LockdError as e:
            out = {"id": rid, "ok": False, "error": {"code": e.code, "message": str(e)}}
        except asyncio.CancelledError:
            out = {"id": rid, "ok": False, "error": {"code": "cancelled", "message": "cancelled"}}
        except Exception as e:  # noqa: BLE001 - every request gets an answer
            out = {"id": rid, "ok": False, "error": {"code": "other", "message": f"{type(e).__name__}: {e}"}}
        out["t0"], out["t1"] = t0, time.time_ns()
        self.emit(out)
        if req.get("op") == "exit":
            os._exit(0)

    async def op_unknown(self, req):
        raise Fail("invalid", f"unknown op {req.get('op')!r}")

    async def op_hello(self, req):
        return {"client": "python", "version": "1", "capabilities": CAPABILITIES}

    async def op_open_session(self, req):
        name = req["session"]
        s = await self.client.session(ttl=req.get("ttl_ms", 10000) / 1000, owner=req.get("owner") or None)
        self.sessions[name] = s

        def lost(err):
            if not isinstance(err, E.SessionClosed):
                self.emit({"event": "lease_lost", "session": name, "t": time.time_ns(),
                           "deadline": s.deadline_unix_ns()})
        s.on_lost(lost)
        return {"session_id": s.id, "owner": s.owner}

    async def op_close_session(self, req):
        s = self.session(req)
        await s.close()
        return {}

    async def op_session_deadline(self, req):
        return {"deadline": self.session(req).deadline_unix_ns()}

    async def _take(self, req, kind, obj, coro):
        if req.get("lock") in self.locks and getattr(self.locks[req["lock"]][1], "token", 0):
            coro.close()
            raise Fail("already_held", f"lock handle {req['lock']!r} holds a lock")
        self.locks[req["lock"]] = (kind, obj)
        return {"token": await coro}

    async def op_lock(self, req):
        m = self.session(req).mutex(req["name"], max_hold=(req.get("max_hold_ms") or 0) / 1000)
        return await self._take(req, "mutex", m, m.lock(self.timeout(req)))

    async def op_try_lock(self, req):
        m = self.session(req).mutex(req["name"], max_hold=(req.get("max_hold_ms") or 0) / 1000)
        return await self._take(req, "mutex", m, m.try_lock())

    async def op_semaphore(self, req):
        m = self.session(req).semaphore(req["name"], int(req["permits"]))
        return await self._take(req, "sem", m, m.try_acquire() if req.get("try") else m.acquire(self.timeout(req)))

    async def op_rlock(self, req):
        m = self.session(req).rwmutex(req["name"])
        return await self._take(req, "rw", m, m.try_rlock() if req.get("try") else m.rlock(self.timeout(req)))

    async def op_wlock(self, req):
        m = self.session(req).rwmutex(req["name"])
        return await self._take(req, "rw", m, m.try_lock() if req.get("try") else m.lock(self.timeout(req)))

    async def op_multi_lock(self, req):
        for mode in req.get("modes") or []:
            if mode != "exclusive":
                raise Fail("invalid", f"multi_lock: mode {mode!r}: exclusive only")
        h = req.get("lock")
        if h in self.locks and self.locks[h][1].held:
            raise Fail("already_held", f"lock handle {h!r} holds a lock")
        m = self.session(req).multi_lock(req.get("names") or [])
        self.locks[h] = ("multi", m)
        tokens = await (m.try_lock() if req.get("try") else m.lock(self.timeout(req)))
        return {"tokens": tokens}

    async def op_lock_deadline(self, req):
        kind, m = self.lock(req)
        if kind != "mutex":
            raise Fail("invalid", f"lock {req.get('lock')!r} is not a mutex")
        return {"deadline": m.deadline_unix_ns()}

    async def op_unlock(self, req):
        kind, m = self.lock(req)
        if kind in ("mutex", "multi"):
            await m.unlock()
        elif kind == "sem":
            await m.release()
        else:
            await m.release()
        return {}

    async def op_guarded(self, req):
        kind, m = self.lock(req)
        try:
            if kind == "multi":
                return {"tokens": m.check()}
            return {"token": m.check()}
        except E.NotHeld as e:
            raise Fail("lease_lost", str(e)) from None

    async def op_check_token(self, req):
        r = await self.client.check_token(req["name"], int(req["token"]))
        info = await self.client.describe(req["name"])
        current = max((h.token for h in info.holders), default=0) if info else 0
        return {"valid": r.valid, "current": current}

    async def op_complete(self, req):
        _, m = self.lock(req)
        await m.complete(req["retention_ms"] / 1000)
        return {}

    async def op_campaign(self, req):
        e = self.session(req).election(req["name"])
        self.elections[req["election"]] = e
        v = req.get("value", "")
        return {"token": await e.campaign(v.encode() if isinstance(v, str) else v, self.timeout(req))}

    async def op_resign(self, req):
        e = self.elections.get(req.get("election", ""))
        if e is None:
            raise Fail("not_found", f"no election {req.get('election')!r}")
        await e.resign()
        return {}

    def _start(self, handle, coro):
        old = self.streams.pop(handle, None)
        if old:
            old.cancel()
        self.streams[handle] = asyncio.ensure_future(coro)

    async def op_observe(self, req):
        name, h = req["name"], req["observe"]

        async def run():
            async for ld in self.client.observe(name):
                self.emit({"event": "leader", "observe": h, "value": ld.value.decode(errors="replace") if ld else "",
                           "token": ld.token if ld else 0, "t": time.time_ns()})
        self._start(h, run())
        return {}

    async def op_watch(self, req):
        h = req["watch"]

        async def run():
            async for ev in self.client.watch(req.get("prefix", ""), req.get("from", "") or ""):
                self.emit({"event": "watch", "watch": h, "kind": ev.kind, "name": ev.name, "position": ev.position,
                           "token": ev.token, "session_id": ev.session, "t": time.time_ns()})
        self._start(h, run())
        return {}

    async def op_stop(self, req):
        h = req.get("observe") or req.get("watch") or ""
        t = self.streams.pop(h, None)
        if t is None:
            raise Fail("not_found", f"no observe or watch {h!r}")
        t.cancel()
        return {}

    async def op_exit(self, req):
        for t in self.streams.values():
            t.cancel()
        await self.client.close()
        return {}

    async def run(self):
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while True:
            line = await reader.readline()
            if not line:
                break
            line = line.strip()
            if not line:
                continue
            try:
                req = json.loads(line)
            except ValueError as e:
                self.emit({"id": None, "ok": False, "error": {"code": "invalid", "message": f"bad json: {e}"},
                           "t0": time.time_ns(), "t1": time.time_ns()})
                continue
            t = asyncio.ensure_future(self.handle(req))
            self.tasks.add(t)
            t.add_done_callback(self.tasks.discard)
        # stdin closed: let the requests in flight answer (bounded), then close.
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=5)
        await self.client.close()


def main():
    asyncio.run(Driver().run())


if __name__ == "__main__":
    main()
