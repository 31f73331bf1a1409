"""The stream's Gate (its write turn and acquire limit): FIFO, and a waiter
cancelled as it is handed a place passes the place on. Pure asyncio logic,
no server needed."""

import asyncio

import pytest

from lockd._stream import Gate


async def test_gate_fifo_and_cancelled_waiters():
    g = Gate(1)
    assert g.try_enter() and not g.try_enter()
    order = []

    async def waiter(i):
        await g.enter()
        order.append(i)

    a, b, c = (asyncio.ensure_future(waiter(i)) for i in range(3))
    await asyncio.sleep(0)
    b.cancel()  # cancelled while waiting: it must not take a place
    await asyncio.sleep(0)
    g.leave()  # to a
    await asyncio.sleep(0)
    assert order == [0]
    g.leave()  # b is gone: to c
    await asyncio.sleep(0)
    assert order == [0, 2]
    with pytest.raises(asyncio.CancelledError):
        await b
    g.leave()
    assert g.free == 1 and not g.waiters


async def test_gate_place_handed_to_a_cancelled_waiter_is_passed_on():
    g = Gate(1)
    assert g.try_enter()
    a = asyncio.ensure_future(g.enter())
    b = asyncio.ensure_future(g.enter())
    await asyncio.sleep(0)
    g.leave()  # a's future is set ...
    a.cancel()  # ... and a is cancelled before it runs: b gets the place
    with pytest.raises(asyncio.CancelledError):
        await a
    await asyncio.wait_for(b, 5)
    assert g.free == 0
    g.leave()
    assert g.free == 1
