"""A redis-server of a test's own, which it may stop and start again under its clients.

It uses the redis-server the services script installed, on a free port, without
persistence: a restart empties it, as a Redis without persistence does after a crash.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
import redis


class PrivateRedis:
    """Start with :meth:`start`; ``url`` names its database 0, ``base_url`` the server."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed: scripts/services up redis installs it"
        self.binary = binary
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.base_url = f"redis://127.0.0.1:{self.port}"
        self.url = f"{self.base_url}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


@pytest.fixture
def private_redis(redis_url: str) -> Iterator[PrivateRedis]:  # redis_url: the services are installed
    """A started PrivateRedis, stopped at teardown."""
    server = PrivateRedis()
    server.start()
    yield server
    server.stop()
