"""The conformance driver (protocol v1) as the suite drives it: a process
speaking JSON lines, against a real lockd serve."""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

DRIVER = os.path.join(os.path.dirname(__file__), "..", "driver.py")  # the source-tree shim of lockd.driver


class Driver:
    def __init__(self, url):
        self.p = subprocess.Popen([sys.executable, DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env={**os.environ, "LOCKD_ENDPOINTS": url})
        self.answers, self.events, self.seen = {}, queue.Queue(), []
        self.cv = threading.Condition()
        self.next = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            m = json.loads(line)
            if "id" in m:
                with self.cv:
                    self.answers[m["id"]] = m
                    self.cv.notify_all()
            else:
                self.events.put(m)

    def send(self, op, **args):
        self.next += 1
        self.p.stdin.write(json.dumps({"id": self.next, "op": op, **args}) + "\n")
        self.p.stdin.flush()
        return self.next

    def wait(self, rid, timeout=30):
        with self.cv:
            assert self.cv.wait_for(lambda: rid in self.answers, timeout), f"no answer to {rid}"
            return self.answers.pop(rid)

    def call(self, op, **args):
        a = self.wait(self.send(op, **args))
        assert a["t0"] <= a["t1"]
        return a

    def event(self, event_type, timeout=20, **match):
        """The first event of the type matching match (seen or to come);
        events that do not match are kept for later calls."""
        def hit(e):
            return e["event"] == event_type and all(e.get(k) == v for k, v in match.items())
        for i, e in enumerate(self.seen):
            if hit(e):
                return self.seen.pop(i)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                e = self.events.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                break
            if hit(e):
                return e
            self.seen.append(e)
        raise AssertionError(f"no {event_type} event {match}; seen {self.seen}")


@pytest.fixture
def driver(server):
    d = Driver(server.url)
    yield d
    if d.p.poll() is None:
        d.p.kill()
        d.p.wait()


def test_driver_ops(driver):
    d = driver
    assert d.call("hello")["client"] == "python"
    assert d.call("open_session", session="a", ttl_ms=5000, owner="alice")["owner"] == "alice"
    d.call("open_session", session="b", ttl_ms=5000, owner="bob")
    t1 = d.call("try_lock", session="a", lock="la", name="drv/m")["token"]
    busy = d.call("try_lock", session="b", lock="lb", name="drv/m")
    assert busy["error"]["code"] == "busy" and busy["error"]["holder"] == "alice"
    late = d.call("lock", session="b", lock="lb", name="drv/m", timeout_ms=300)
    assert late["error"]["code"] == "deadline"
    waiting = d.send("lock", session="b", lock="lb2", name="drv/m", timeout_ms=10000)
    assert d.call("guarded", lock="la")["token"] == t1
    d.call("unlock", lock="la")
    t2 = d.wait(waiting)["token"]
    assert t2 > t1
    chk = d.call("check_token", name="drv/m", token=t1)
    assert chk["valid"] is False and chk["current"] == t2
    assert d.call("guarded", lock="la")["error"]["code"] == "lease_lost"
    d.call("complete", lock="lb2", retention_ms=60000)
    assert d.call("try_lock", session="a", lock="lc", name="drv/m")["error"]["code"] == "done"
    assert d.call("semaphore", session="a", lock="s1", name="drv/s", permits=1)["ok"]
    assert d.call("semaphore", session="b", lock="s2", name="drv/s", permits=1, **{"try": True})["error"]["code"] == "busy"
    assert d.call("rlock", session="a", lock="r1", name="drv/rw")["ok"]
    assert d.call("wlock", session="b", lock="w1", name="drv/rw", **{"try": True})["error"]["code"] == "busy"
    d.call("observe", observe="o", name="drv/e")
    d.call("watch", watch="w", prefix="drv/e")
    assert d.event("leader", observe="o")["token"] == 0
    te = d.call("campaign", session="a", election="e", name="drv/e", value="v1", timeout_ms=5000)["token"]
    assert d.event("leader", observe="o", token=te)["value"] == "v1"
    assert d.event("watch", watch="w", kind="granted")["token"] == te
    d.call("resign", election="e")
    d.event("watch", watch="w", kind="released", token=te)
    d.call("stop", observe="o")
    d.call("stop", watch="w")
    d.call("close_session", session="b")
    assert d.call("exit")["ok"]
    assert d.p.wait(10) == 0


def test_driver_paused_past_its_ttl_reports_lease_lost(driver, server):
    """SIGSTOP the driver past its TTL: on waking it answers guarded with
    lease_lost and emits lease_lost, and its deadline lay before the
    server's own expiry could come (at least TTL after the last keepalive)."""
    d = driver
    d.call("open_session", session="s", ttl_ms=1500)
    d.call("lock", session="s", lock="l", name="drv/pause", timeout_ms=5000)
    deadline = d.call("session_deadline", session="s")["deadline"]
    os.kill(d.p.pid, signal.SIGSTOP)
    time.sleep(3)  # the fault itself: the process is paused past its TTL
    os.kill(d.p.pid, signal.SIGCONT)
    g = d.call("guarded", lock="l")
    assert g["ok"] is False and g["error"]["code"] == "lease_lost"
    ev = d.event("lease_lost", session="s")
    assert ev["deadline"] <= g["t0"]
    assert d.call("session_deadline", session="s")["deadline"] >= deadline
