import os
import sys

import pytest

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
sys.path.insert(0, os.path.dirname(__file__))

import lockdproc  # noqa: E402


def _binary():
    try:
        return lockdproc.lockd_bin()
    except lockdproc.Missing as e:
        if os.environ.get("CI") == "true":
            pytest.fail(str(e))
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def lockd_binary():
    return _binary()


@pytest.fixture(scope="module")
def server(lockd_binary):
    s = lockdproc.Server(lockd_binary)
    yield s
    s.stop()


@pytest.fixture
def fresh_server(lockd_binary):
    """A server of the test's own (to pause or stop it)."""
    s = lockdproc.Server(lockd_binary)
    yield s
    s.stop()


@pytest.fixture
def cluster3(lockd_binary):
    nodes = lockdproc.cluster(lockd_binary, 3)
    yield nodes
    for s in nodes:
        s.stop()
