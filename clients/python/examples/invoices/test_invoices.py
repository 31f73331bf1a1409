"""Four processes, one run: the month's invoices are sent exactly once,
also when the first holder crashes half-way."""

import collections
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests"))

from conftest import server, lockd_binary  # noqa: E402,F401  (fixtures)

CUSTOMERS = 30


def start(server, outbox, worker, *extra):
    return subprocess.Popen(
        [sys.executable, os.path.join(HERE, "invoices.py"), "--endpoints", server.url, "--month", "2026-11",
         "--outbox", outbox, "--customers", str(CUSTOMERS), "--worker", worker, "--ttl", "2", "--wait", "60",
         *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_four_processes_send_each_invoice_once(server, tmp_path):
    outbox = str(tmp_path / "outbox")
    # A first run crashes after 7 invoices, holding the lock.
    crashed = start(server, outbox, "crasher", "--crash-after", "7")
    assert crashed.wait(60) == 3, crashed.stderr.read()
    # Cron starts the four servers' processes together.
    procs = [start(server, outbox, f"server-{i}", "--pace", "0.01") for i in range(4)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    by = collections.Counter(r["result"] for r in results)
    assert by == {"sent": 1, "done": 3}, results
    assert [r["sent"] for r in results if r["result"] == "sent"] == [CUSTOMERS - 7]
    with open(os.path.join(outbox, "sent.log")) as f:
        lines = [ln.split(" token=")[0] for ln in f.read().splitlines()]
    assert len(lines) == CUSTOMERS and len(set(lines)) == CUSTOMERS, "every invoice exactly once"
    # A late process (cron fired twice) sends nothing: the month is done.
    late = start(server, outbox, "late")
    out, _ = late.communicate(timeout=60)
    assert json.loads(out.strip().splitlines()[-1])["result"] == "done"
