"""Bearer tokens against a real lockd serve --auth-file."""

import hashlib
import os
import secrets

import pytest

import lockd
import lockdproc


@pytest.fixture(scope="module")
def auth_server(lockd_binary, tmp_path_factory):
    d = tmp_path_factory.mktemp("auth")
    token = secrets.token_hex(16)
    f = d / "auth.txt"
    f.write_text(f"token sha256:{hashlib.sha256(token.encode()).hexdigest()} billing-app\n"
                 "grant billing-app lock billing/\n")
    s = lockdproc.Server(lockd_binary, "--auth-file", str(f))
    yield s, token
    s.stop()


async def test_token_grants_and_refusals(auth_server):
    server, token = auth_server
    async with lockd.Client(server.url, token=token) as c:
        s = await c.session(ttl=5)
        assert await s.mutex("billing/run").try_lock() > 0
        with pytest.raises(lockd.PermissionDenied):
            await s.mutex("payroll/run").try_lock()
    async with lockd.Client(server.url, token="wrong-" + token, retry_timeout=2) as c:
        with pytest.raises(lockd.Unauthenticated):
            await c.session(ttl=5)
    os.environ.pop("LOCKD_TOKEN", None)
    async with lockd.Client(server.url, retry_timeout=2) as c:
        with pytest.raises(lockd.Unauthenticated):
            await c.session(ttl=5)
