"""Invalid UTF-8 in a text frame: closed 1007 by uvicorn, logged as one INFO line, never a traceback."""

from __future__ import annotations

import logging
import tempfile

import pytest
from voxgate.engine.fake import FakeEngine
from voxgate.gateway.app import create_app
from voxgate.gateway.server.config import uvicorn_ws_options
from voxgate.gateway.server.serve import quiet_client_faults
from voxgate.gateway.settings import Settings
from websockets.exceptions import ConnectionClosed

from tests.conftest import LogRecords, recv, serve, voxgate_connect


@pytest.mark.parametrize("configured", [False, True])
def test_invalid_utf8_closes_1007_without_a_traceback(configured: bool) -> None:
    handler = LogRecords()
    uvicorn_log = logging.getLogger("uvicorn.error")
    with tempfile.TemporaryDirectory() as voices_dir:
        settings = Settings(voices_dir=voices_dir)
        with serve(create_app(settings, engine=FakeEngine()), **uvicorn_ws_options(settings)) as address:
            # After uvicorn's Config has set up its loggers, as voxgate serve's DrainingServer does.
            quiet_client_faults()
            uvicorn_log.addHandler(handler)
            try:
                with voxgate_connect(f"ws://{address}/v1/audio/speech/stream") as ws:
                    if configured:
                        ws.send('{"type": "session.config"}')
                        assert isinstance(recv(ws), dict)
                    ws.send(b'{"type": "input.text", "text": "\xc3\x28"}', text=True)
                    with pytest.raises(ConnectionClosed) as closed:
                        while True:
                            recv(ws)
                    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
            finally:
                uvicorn_log.removeHandler(handler)
    faults = [r for r in handler.records if "UTF-8" in r.getMessage()]
    assert faults, "uvicorn reported it"
    assert all(r.levelno == logging.INFO and not r.exc_info for r in faults)
