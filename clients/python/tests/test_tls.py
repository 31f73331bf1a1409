"""TLS with client certificates against a real lockd serve."""

import subprocess

import pytest

import lockd
import lockdproc


@pytest.fixture(scope="module")
def tls_server(lockd_binary, tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    for args in (["ca"], ["node", "n1"], ["client", "alice"]):
        subprocess.run([lockd_binary, "cert", *args, "--dir", str(d)], check=True, capture_output=True)
    s = lockdproc.Server(lockd_binary, "--tls-cert", str(d / "n1.crt"), "--tls-key", str(d / "n1.key"),
                         "--tls-ca", str(d / "ca.crt"), "--tls-client-auth", "require",
                         tls=(str(d / "ca.crt"), str(d / "alice.crt"), str(d / "alice.key")))
    yield s, d
    s.stop()


async def test_tls_with_client_certificate(tls_server):
    server, d = tls_server
    ca, crt, key = ((d / n).read_bytes() for n in ("ca.crt", "alice.crt", "alice.key"))
    async with lockd.Client(server.url, root_certificates=ca, private_key=key, certificate_chain=crt) as c:
        s = await c.session(ttl=5)
        assert await s.mutex("tls/job").try_lock() > 0
    # Without a client certificate the server refuses the handshake.
    async with lockd.Client(server.url, root_certificates=ca, retry_timeout=1, request_timeout=1) as c:
        with pytest.raises(lockd.LockdError):
            await c.session(ttl=5)
