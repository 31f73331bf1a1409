"""MultiLock (AcquireMany) and the deadlock refusal against a real lockd serve process."""

import asyncio
import time
import uuid

import pytest

import lockd


def uniq(p: str) -> str:
    return f"{p}/{uuid.uuid4().hex[:8]}"


async def _poll(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while not await cond():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.05)


async def _waiters(c, name):
    info = await c.describe(name)
    return len(info.waiters) if info else 0


async def _holders(c, name):
    info = await c.describe(name)
    return len(info.holders) if info else 0


async def test_set_refused_queued_granted_whole(server):
    a, b = uniq("ml-a"), uniq("ml-b")
    async with lockd.Client(server.url) as c:
        s1 = await c.session(ttl=5, owner="single")
        s2 = await c.session(ttl=5, owner="set")
        single = s1.mutex(a)
        ta = await single.try_lock()
        m = s2.multi_lock([a, b])
        with pytest.raises(lockd.Busy):
            await m.try_lock()
        assert await _holders(c, b) == 0
        waiter = asyncio.ensure_future(m.lock(timeout=20))
        await _poll(lambda: _waiters_is(c, b, 1))
        assert await _holders(c, b) == 0, "a queued set holds nothing"
        with pytest.raises(lockd.Busy):
            await s1.mutex(b).try_lock()
        await single.unlock()
        tokens = await waiter
        assert set(tokens) == {a, b} and tokens[a] > ta
        assert m.check() == tokens
        with pytest.raises(lockd.Busy):
            await s1.mutex(b).try_lock()
        await m.unlock()
        with pytest.raises(lockd.NotHeld):
            m.check()
        assert await s1.mutex(b).try_lock() > tokens[b]


async def _waiters_is(c, name, n):
    return await _waiters(c, name) == n


async def test_opposite_orders_do_not_deadlock(server):
    x, y = uniq("ml-x"), uniq("ml-y")
    inside = [0, 0]
    async with lockd.Client(server.url) as c:
        ss = [await c.session(ttl=5), await c.session(ttl=5)]

        async def worker(s, names):
            for _ in range(5):
                async with s.multi_lock(names):
                    inside[0] += 1
                    inside[1] = max(inside[1], inside[0])
                    await asyncio.sleep(0)
                    inside[0] -= 1
        await asyncio.wait_for(asyncio.gather(worker(ss[0], [x, y]), worker(ss[1], [y, x])), 60)
    assert inside[1] == 1


async def test_bad_names_and_deadlock(server):
    p, q = uniq("ml-p"), uniq("ml-q")
    async with lockd.Client(server.url) as c:
        s1 = await c.session(ttl=5)
        s2 = await c.session(ttl=5)
        with pytest.raises(lockd.InvalidArgument):
            await s1.multi_lock([p]).try_lock()
        with pytest.raises(lockd.InvalidArgument):
            await s1.multi_lock([p, p]).try_lock()
        await s1.mutex(p).try_lock()
        hq = s2.mutex(q)
        await hq.try_lock()
        first = asyncio.ensure_future(s1.mutex(q).lock(timeout=20))
        await _poll(lambda: _waiters_is(c, q, 1))
        with pytest.raises(lockd.Deadlock):
            await s2.mutex(p).lock(timeout=10)
        await hq.unlock()
        await first


def test_sync_multi_lock(server):
    from lockd.sync import Client
    a, b = uniq("ml-sa"), uniq("ml-sb")
    with Client(server.url) as c, c.session(ttl=5) as s:
        with s.multi_lock([a, b]) as m:
            assert set(m.tokens) == {a, b}
        assert m.tokens == {}


async def test_hold_budget_client_gives_up_first(server):
    name = uniq("budget")
    async with lockd.Client(server.url) as c:
        s1 = await c.session(ttl=10)
        s2 = await c.session(ttl=10)
        with pytest.raises(lockd.InvalidArgument):
            await s1.mutex(name, max_hold=0.01).lock()
        m = s1.mutex(name, max_hold=1.0)
        t1 = await m.lock(timeout=10)
        assert m.deadline < s1.deadline, "the budget ends before the lease"
        assert m.held
        t2 = await s2.mutex(name).lock(timeout=20)
        # Granted to the next holder only after the server ended the hold,
        # which is after the client's deadline for it.
        assert not m.held
        with pytest.raises(lockd.HoldExpired):
            m.check()
        assert t2 > t1
        assert s1.err is None, "the session lives on"
