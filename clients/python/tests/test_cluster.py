"""Three real lockd nodes: the client follows the leader and its sessions
and locks survive a leader killed with SIGKILL."""

import asyncio
import signal
import time

import lockd


async def wait_voters(c, n, timeout=30):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        st = await c.status()
        if st.leader and sum(1 for m in st.members if m.voter) == n:
            return st
        await asyncio.sleep(0.1)  # polling real processes, bounded
    raise AssertionError("cluster did not form")


async def test_leader_kill_sessions_and_locks_survive(cluster3):
    urls = [n.url for n in cluster3]
    async with lockd.Client(urls) as c:
        st = await wait_voters(c, 3)
        s = await c.session(ttl=6, owner="survivor")
        m = s.mutex("cluster/job")
        tok = await m.lock(timeout=20)
        leader_api = next(mb.api for mb in st.members if mb.id == st.leader)
        victim = next(n for n in cluster3 if lockd._rpc.normalize(n.url) == lockd._rpc.normalize(leader_api))
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        t0 = time.monotonic()
        # Calls go on through the new leader; the old one is gone.
        async with lockd.Client([n.url for n in cluster3 if n is not victim]) as other:
            s2 = await other.session(ttl=6)
            try:
                await s2.mutex("cluster/job").try_lock()
                raise AssertionError("the lock was granted twice")
            except lockd.Busy as e:
                assert e.holders[0].token == tok
        # Outlast a few keepalive rounds past the failover.
        while time.monotonic() - t0 < 8:
            await asyncio.sleep(0.5)
            assert s.err is None, s.err
        assert m.held and (await c.check_token("cluster/job", tok)).valid
        await m.unlock()
