"""Real `lockd serve` processes on free 127.0.0.1 ports, for tests and examples."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


class Missing(Exception):
    """No lockd binary and no Go toolchain to build one."""


def lockd_bin() -> str:
    """LOCKD_BIN, or a lockd built from this repository (once per run)."""
    b = os.environ.get("LOCKD_BIN")
    if b:
        if not os.access(b, os.X_OK):
            raise Missing(f"LOCKD_BIN={b} is not an executable")
        return b
    out = os.path.join(tempfile.gettempdir(), f"lockd-pytest-{os.getuid()}", "lockd")
    if os.access(out, os.X_OK) and os.environ.get("LOCKD_REBUILD") != "1" and getattr(lockd_bin, "built", False):
        return out
    go = shutil.which("go")
    if go is None:
        raise Missing("no lockd binary: set LOCKD_BIN or install Go to build ./cmd/lockd")
    subprocess.run([go, "build", "-o", out, "./cmd/lockd"], cwd=ROOT, check=True)
    lockd_bin.built = True
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One lockd node: a single-node cluster, or a member joining join."""

    def __init__(self, binary: str, *extra: str, join: str = "", node_id: str = "", tls=None):
        self.dir = tempfile.mkdtemp(prefix="lockd-py-")
        self.port, self.raft = free_port(), free_port()
        # tls: (ca, cert, key) PEM paths the readiness check presents.
        self.tls = tls
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.log = open(os.path.join(self.dir, "log"), "wb")
        self.proc = subprocess.Popen(
            [binary, "serve", "--data-dir", os.path.join(self.dir, "data"), "--listen", f"127.0.0.1:{self.port}",
             "--raft-listen", f"127.0.0.1:{self.raft}",
             *(["--join", join] if join else []), *(["--node-id", node_id] if node_id else []), *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_ready()

    def wait_ready(self, timeout: float = 30.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lockd exited with {self.proc.returncode}: {self.read_log()}")
            try:
                ctx = None
                if self.tls:
                    import ssl
                    ctx = ssl.create_default_context(cafile=self.tls[0])
                    ctx.load_cert_chain(self.tls[1], self.tls[2])
                with urllib.request.urlopen(self.url + "/readyz", timeout=1, context=ctx) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)  # polling a real process's readiness, bounded by timeout
        raise RuntimeError(f"lockd not ready within {timeout}s: {self.read_log()}")

    def read_log(self) -> str:
        with open(os.path.join(self.dir, "log"), "rb") as f:
            return f.read().decode(errors="replace")[-4000:]

    def stop(self):
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def cluster(binary: str, n: int = 3) -> list[Server]:
    """n nodes: the first bootstraps, the others join it."""
    first = Server(binary, node_id="n0")
    nodes = [first]
    try:
        for i in range(1, n):
            nodes.append(Server(binary, join=first.url, node_id=f"n{i}"))
    except Exception:
        for s in nodes:
            s.stop()
        raise
    return nodes
