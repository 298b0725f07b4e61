"""Every client test runs over both wire protocols: `Cluster.client()` speaks the one of the
`client_protocol` fixture, v2 then v3. A module of pure logic says `BOTH_PROTOCOLS = False`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.client import cluster


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "client_protocol" in metafunc.fixturenames and getattr(metafunc.module, "BOTH_PROTOCOLS", True):
        metafunc.parametrize("client_protocol", ["v2", "v3"], indirect=True)


@pytest.fixture(autouse=True)
def client_protocol(request: pytest.FixtureRequest) -> Iterator[str]:
    cluster.PROTOCOL = getattr(request, "param", "v2")
    yield cluster.PROTOCOL
    cluster.PROTOCOL = "v2"
