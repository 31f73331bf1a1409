#!/usr/bin/python3
"""The monthly invoices, sent exactly once by whichever of several processes
gets there first.

Every process (one per server, started by cron at the same minute) runs:

    invoices.py --month 2026-11 --outbox DIR --customers 50

It waits for the lock ``invoices/<month>``. The holder sends the invoices
that are not in the outbox yet (a crashed predecessor may have sent some),
checking its lease before each one, and then marks the month done with
``complete``: the processes still waiting, and any started later in the
retention, are answered "already done" and exit without sending anything.
If the holder dies, its session expires and a waiting process takes over
where it stopped.

Each process prints one JSON line: {"worker", "result": "sent" | "done", "sent": n}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import lockd  # noqa: E402

RETENTION = 40 * 86400.0  # longer than a month: the run stays done until the next one


def send_invoice(outbox: str, customer: int, month: str, token: int, worker: str):
    """'Sends' one invoice: appends it to the outbox's log and records it as
    sent. os.link fails if the invoice was recorded already, so a second
    sending would not go unnoticed."""
    with open(os.path.join(outbox, "sent.log"), "a") as log:
        log.write(f"{month} customer-{customer} token={token} by={worker}\n")
    tmp = os.path.join(outbox, f".customer-{customer}.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(f"{token}\n")
    os.link(tmp, os.path.join(outbox, f"customer-{customer}"))
    os.unlink(tmp)


async def run(a) -> dict:
    async with lockd.Client(a.endpoints) as client:
        async with await client.session(ttl=a.ttl, owner=a.worker) as session:
            m = session.mutex(f"invoices/{a.month}")
            try:
                token = await m.lock(timeout=a.wait)
            except lockd.AlreadyDone:
                return {"worker": a.worker, "result": "done", "sent": 0}
            sent = 0
            for customer in range(a.customers):
                if os.path.exists(os.path.join(a.outbox, f"customer-{customer}")):
                    continue  # sent by a predecessor that died
                m.check()  # raises LeaseLost once the client deadline passed: stop sending
                send_invoice(a.outbox, customer, a.month, token, a.worker)
                sent += 1
                if a.crash_after and sent == a.crash_after:
                    os._exit(3)  # a crash: no unlock, no complete; the session expires
                await asyncio.sleep(a.pace)
            await m.complete(RETENTION)
            return {"worker": a.worker, "result": "sent", "sent": sent}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--endpoints", default=os.environ.get("LOCKD_ENDPOINTS", "http://127.0.0.1:7070"))
    p.add_argument("--month", required=True)
    p.add_argument("--outbox", required=True)
    p.add_argument("--customers", type=int, default=50)
    p.add_argument("--worker", default=f"worker-{os.getpid()}")
    p.add_argument("--ttl", type=float, default=10.0, help="session TTL, seconds")
    p.add_argument("--wait", type=float, default=600.0, help="how long to wait for the lock, seconds")
    p.add_argument("--pace", type=float, default=0.0, help="pause after each invoice, seconds")
    p.add_argument("--crash-after", type=int, default=0, help="exit abruptly after this many invoices (for the test)")
    a = p.parse_args()
    os.makedirs(a.outbox, exist_ok=True)
    print(json.dumps(asyncio.run(run(a))), flush=True)


if __name__ == "__main__":
    main()
