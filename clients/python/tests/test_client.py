"""The asyncio client against real lockd serve processes."""

import asyncio
import os
import signal
import time
import uuid

import pytest

import lockd
from lockd import errors as E
from lockd._pb import lockd_pb2 as pb


def uniq(p: str) -> str:
    return f"{p}/{uuid.uuid4().hex[:8]}"


async def test_mutex_exclusion_busy_and_tokens(server):
    name = uniq("mutex")
    async with lockd.Client(server.url) as c:
        a = await c.session(ttl=5, owner="alice")
        b = await c.session(ttl=5, owner="bob")
        ma, mb = a.mutex(name), b.mutex(name)
        t1 = await ma.try_lock()
        with pytest.raises(lockd.Busy) as busy:
            await mb.try_lock()
        assert busy.value.holders[0].owner == "alice"
        assert busy.value.holders[0].token == t1
        waiter = asyncio.ensure_future(mb.lock(timeout=10))
        await asyncio.sleep(0.2)
        assert not waiter.done()
        await ma.unlock()
        t2 = await waiter
        assert t2 > t1
        assert (await c.check_token(name, t2)).valid
        assert not (await c.check_token(name, t1)).valid
        with pytest.raises(lockd.NotHeld):
            await ma.unlock()


async def test_lock_timeout_withdraws_the_wait(server):
    name = uniq("timeout")
    async with lockd.Client(server.url) as c:
        a, b = await c.session(ttl=5), await c.session(ttl=5)
        await a.mutex(name).lock()
        t0 = time.monotonic()
        with pytest.raises(lockd.Deadline):
            await b.mutex(name).lock(timeout=0.5)
        assert time.monotonic() - t0 < 5
        info = await c.describe(name)
        assert len(info.waiters) == 0, "the timed-out wait was withdrawn"


async def test_cancelled_lock_withdraws_the_wait(server):
    name = uniq("cancel")
    async with lockd.Client(server.url) as c:
        a, b = await c.session(ttl=5), await c.session(ttl=5)
        await a.mutex(name).lock()
        task = asyncio.ensure_future(b.mutex(name).lock())
        await asyncio.sleep(0.3)
        assert len((await c.describe(name)).waiters) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len((await c.describe(name)).waiters) == 0


async def test_resent_acquire_with_same_seq_gets_same_answer(server):
    name = uniq("seq")
    async with lockd.Client(server.url) as c:
        s = await c.session(ttl=5)
        seq = s.seqs.begin()

        def build(**kw):
            return pb.AcquireRequest(name=name, mode=pb.MODE_EXCLUSIVE, **kw)
        r1 = await s.call_seq(seq, "Acquire", build, pb.AcquireResponse)
        r2 = await s.call_seq(seq, "Acquire", build, pb.AcquireResponse)
        assert r1.status == r2.status == pb.ACQUIRE_STATUS_GRANTED
        assert r1.token == r2.token
        s.seqs.end(seq)


async def test_semaphore_and_rwmutex(server):
    sem, rw = uniq("sem"), uniq("rw")
    async with lockd.Client(server.url) as c:
        s1, s2, s3 = await c.session(ttl=5), await c.session(ttl=5), await c.session(ttl=5)
        await s1.semaphore(sem, 2).try_acquire()
        await s2.semaphore(sem, 2).try_acquire()
        with pytest.raises(lockd.Busy):
            await s3.semaphore(sem, 2).try_acquire()
        with pytest.raises(lockd.LimitMismatch):
            await s3.semaphore(sem, 3).try_acquire()
        r1, r2, w = s1.rwmutex(rw), s2.rwmutex(rw), s3.rwmutex(rw)
        await r1.try_rlock()
        await r2.try_rlock()
        with pytest.raises(lockd.Busy):
            await w.try_lock()
        await r1.runlock()
        await r2.runlock()
        assert await w.try_lock() > 0


async def test_complete_runs_once(server):
    name = uniq("once")
    async with lockd.Client(server.url) as c:
        a, b = await c.session(ttl=5), await c.session(ttl=5)
        m = a.mutex(name)
        await m.lock()
        await m.complete(60)
        assert m.token == 0
        with pytest.raises(lockd.AlreadyDone) as done:
            await b.mutex(name).lock(timeout=5)
        assert done.value.mark is not None and done.value.mark.owner == a.owner


async def test_election_and_observe(server):
    name = uniq("election")
    async with lockd.Client(server.url) as c:
        a, b = await c.session(ttl=5), await c.session(ttl=5)
        seen = []
        got = asyncio.Event()

        async def watch():
            async for ld in c.observe(name):
                seen.append(ld)
                got.set()
        obs = asyncio.ensure_future(watch())
        ea, eb = a.election(name), b.election(name)
        ta = await ea.campaign(b"a")
        tb_task = asyncio.ensure_future(eb.campaign(b"b", timeout=10))
        await ea.proclaim(b"a2")
        assert (await c.leader(name)).value == b"a2"
        await ea.resign()
        tb = await tb_task
        assert tb > ta
        deadline = time.monotonic() + 10
        while not (seen and seen[-1] is not None and seen[-1].token == tb) and time.monotonic() < deadline:
            got.clear()
            try:
                await asyncio.wait_for(got.wait(), 1)
            except asyncio.TimeoutError:
                pass
        obs.cancel()
        tokens = [x.token if x else 0 for x in seen]
        assert ta in tokens and tb in tokens, tokens
        assert tokens.index(ta) < tokens.index(tb)


async def test_watch_sees_grant_and_release(server):
    prefix = uniq("watch")
    async with lockd.Client(server.url) as c:
        events = []
        ready = asyncio.Event()

        async def watch():
            async for ev in c.watch(prefix, state=True):
                events.append(ev)
                if ev.kind == "synced":
                    ready.set()
                if ev.kind == "released":
                    return
        w = asyncio.ensure_future(watch())
        await asyncio.wait_for(ready.wait(), 10)
        s = await c.session(ttl=5)
        m = s.mutex(prefix + "/x")
        tok = await m.lock()
        await m.unlock()
        await asyncio.wait_for(w, 10)
        kinds = [(e.kind, e.token) for e in events if e.kind in ("granted", "released")]
        assert kinds == [("granted", tok), ("released", tok)]


async def test_wrong_secret_is_refused(server):
    async with lockd.Client(server.url) as c:
        s = await c.session(ttl=5)
        s._secret = "0" * 64
        with pytest.raises((lockd.PermissionDenied, lockd.LeaseLost)) as e:
            await s.mutex(uniq("secret")).try_lock()
        assert isinstance(e.value, lockd.PermissionDenied), e.value


async def test_client_deadline_rule_and_keepalive(server):
    async with lockd.Client(server.url) as c:
        before = time.monotonic()
        moved = []
        s = await c.session(ttl=1.5, on_deadline=moved.append)
        # sent >= before, so the deadline is at most before-relative bound.
        assert s.deadline >= before + 1.5 - 0.015 - 0.1 - 0.0001 - (time.monotonic() - before)
        assert s.deadline <= time.monotonic() + 1.5 - 0.015 - 0.1
        first = s.deadline
        end = time.monotonic() + 5
        while s.deadline == first and time.monotonic() < end:
            await asyncio.sleep(0.05)  # waiting for a real keepalive round trip
        assert s.deadline > first, "a keepalive moved the deadline"
        assert len(moved) >= 2 and s.err is None


async def test_lease_lost_before_server_expiry(fresh_server):
    """SIGSTOP the server: keepalives go unanswered, the client declares the
    lease lost at its deadline, strictly before the server could expire it."""
    name = uniq("stop")
    async with lockd.Client(fresh_server.url, request_timeout=1) as c:
        s = await c.session(ttl=2)
        m = s.mutex(name)
        t1 = await m.lock()
        lost_at = []
        s.on_lost(lambda e: lost_at.append(time.monotonic()))
        os.kill(fresh_server.proc.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            await asyncio.wait_for(s.done.wait(), 10)
        finally:
            os.kill(fresh_server.proc.pid, signal.SIGCONT)
        assert lost_at and lost_at[0] - stopped < 2.0, "lost within the TTL of the last keepalive"
        assert not m.held
        with pytest.raises(lockd.LeaseLost):
            m.check()
        # The server may now expire the session; a new session gets the lock
        # after it does (the old token is refused).
        s2 = await c.session(ttl=2)
        t2 = await s2.mutex(name).lock(timeout=20)
        assert t2 > t1
        assert (await c.check_token(name, t2)).valid


async def test_dead_endpoint_is_passed_over(server):
    """An endpoint where nothing listens is passed over for one that answers."""
    from tests_helpers import dead_url
    async with lockd.Client([dead_url(), server.url], request_timeout=1) as c:
        s = await c.session(ttl=5)
        assert await s.mutex(uniq("two")).try_lock() > 0


def test_sync_wrapper(server):
    from lockd.sync import Client
    name = uniq("sync")
    with Client(server.url) as c, c.session(ttl=5, owner="sync") as s:
        with s.mutex(name) as m:
            assert m.token > 0 and m.held
            assert c.check_token(name, m.token).valid
            with c.session(ttl=5) as s2:
                with pytest.raises(lockd.Busy):
                    s2.mutex(name).try_lock()
        assert not c.check_token(name, m.aio.token or 1).valid


async def test_calls_and_keepalives_go_over_the_session_stream(server):
    async with lockd.Client(server.url, stream=True) as c:
        sessions = [await c.session(ttl=1.5) for _ in range(5)]
        ep = c._t.eps[0]
        assert ep.stream is not None and ep.stream.broken is None
        firsts = [s.deadline for s in sessions]
        end = time.monotonic() + 5
        while any(s.deadline == f for s, f in zip(sessions, firsts)) and time.monotonic() < end:
            await asyncio.sleep(0.05)  # waiting for real keepalive rounds
        assert all(s.deadline > f for s, f in zip(sessions, firsts)), "every session renewed"
        assert all(s.err is None for s in sessions)
        await sessions[0].mutex(uniq("stream")).try_lock()


async def test_broken_stream_is_reopened_and_calls_go_on(server):
    name = uniq("broken")
    async with lockd.Client(server.url, stream=True) as c:
        s = await c.session(ttl=5)
        m = s.mutex(name)
        await m.lock()
        ep = c._t.eps[0]
        ep.stream.fail("test: cut the stream")  # a fault a real server does not make on demand
        await m.unlock()
        assert ep.stream is not None and ep.stream.broken is None
        assert await m.try_lock() > 0


async def test_stream_calls_time_out_each_at_its_own_deadline(fresh_server):
    """One timer per stream serves every call's deadline: a call sent after
    a longer one, with a shorter timeout, still fails at its own. SIGSTOP
    holds the answers back."""
    from lockd._stream import StreamCallError
    import grpc
    async with lockd.Client(fresh_server.url, stream=True) as c:
        s = await c.session(ttl=30)
        st = c._t.eps[0].stream
        assert st is not None and st.broken is None

        def req():
            return pb.StreamRequest(acquire=pb.AcquireRequest(name=uniq("t"), session_id=s.id, secret=s._secret,
                                                              seq=s.seqs.begin(), ack=s.seqs.ack()))
        os.kill(fresh_server.proc.pid, signal.SIGSTOP)
        try:
            end = time.monotonic() + 10
            while _state(fresh_server.proc.pid) != "T" and time.monotonic() < end:
                await asyncio.sleep(0.01)  # polling a real process until it is stopped
            assert _state(fresh_server.proc.pid) == "T", "the server stopped"
            t0 = time.monotonic()
            long = asyncio.ensure_future(st.send(req(), 8.0))
            await asyncio.sleep(0)
            ended = []
            for t in (0.4, 0.2):
                with pytest.raises(StreamCallError) as ei:
                    await st.send(req(), t)
                assert ei.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                ended.append(time.monotonic() - t0)
            assert not long.done(), "the longer call waits for its own deadline"
            long.cancel()
        finally:
            os.kill(fresh_server.proc.pid, signal.SIGCONT)
        assert ended[0] >= 0.4 and ended[1] >= 0.6, "no call fails before its timeout"
        assert ended[1] < 8.0, "the shorter calls did not wait for the longer one's deadline"


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]
