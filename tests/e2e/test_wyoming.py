"""The real ``wyoming`` package's ``AsyncTcpClient`` against ``voxgate serve --wyoming``
(gateway/routes/wyoming.py).

The events are those Home Assistant's Wyoming integration sends: ``describe``; a one-shot ``synthesize``;
and its streaming sequence (``synthesize-start``, ``synthesize-chunk``s, the whole text again as
``synthesize``, ``synthesize-stop``), read as it reads them. The fake engine's counters show what the engine
did (a hang-up stops it); with Piper, Whisper hears the audio at the rate ``audio-start`` gives.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from voxgate.engine.base import TTSEngine
from voxgate.engine.fake import SECONDS_PER_CHAR, FakeEngine
from voxgate.gateway.app import create_app
from voxgate.gateway.routes.wyoming import parse_address
from voxgate.gateway.settings import Settings
from voxgate.protocol.audio import decode
from wyoming.audio import AudioChunk, AudioStart
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeVoice,
)

from tests.conftest import TIMEOUT_S, serve
from tests.speech_check import load_whisper, word_error_rate
from voxgate.cli import build_parser, main

SENTENCES = "The quick brown fox jumps over the lazy dog. Then it runs far away into the quiet woods."
FIRST, REST = "The quick brown fox jumps over the lazy dog. ", "Then it runs far away into the quiet woods."


@contextmanager
def wyoming_gateway(tts: TTSEngine | None = None, **settings: object) -> Iterator[tuple[str, int]]:
    """A gateway on uvicorn serving Wyoming too, on a port the system picks; yields its Wyoming address."""
    with tempfile.TemporaryDirectory(prefix="voxgate-voices-") as voices_dir:
        app = create_app(
            Settings.from_env({}, wyoming="127.0.0.1:0", voices_dir=voices_dir, **settings), engine=tts
        )
        with serve(app):
            yield app.state.wyoming.address


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def gateway(fake: FakeEngine) -> Iterator[tuple[str, int]]:
    with wyoming_gateway(fake) as address:
        yield address


@dataclass
class Heard:
    """What a client read, in order, with the time each event came."""

    events: list[Event] = field(default_factory=list)
    times: list[float] = field(default_factory=list)

    def types(self) -> list[str]:
        return [e.type for e in self.events]

    def audio(self) -> bytes:
        return b"".join(AudioChunk.from_event(e).audio for e in self.events if AudioChunk.is_type(e.type))

    def start(self) -> AudioStart:
        return AudioStart.from_event(next(e for e in self.events if AudioStart.is_type(e.type)))

    def errors(self) -> list[Error]:
        return [Error.from_event(e) for e in self.events if Error.is_type(e.type)]


async def read_until(client: AsyncTcpClient, last: str, heard: Heard | None = None) -> Heard:
    """Read events until one of type ``last`` (included), or the server hangs up."""
    heard = heard or Heard()
    while True:
        event = await asyncio.wait_for(client.read_event(), TIMEOUT_S)
        if event is None:
            return heard
        heard.events.append(event)
        heard.times.append(time.monotonic())
        if event.type == last:
            return heard


def exchange(address: tuple[str, int], *events: Event, last: str) -> Heard:
    """Write ``events`` on a new connection and read until ``last``."""

    async def run() -> Heard:
        async with AsyncTcpClient(*address) as client:
            for event in events:
                await client.write_event(event)
            return await read_until(client, last)

    return asyncio.run(run())


def streamed(address: tuple[str, int], first: str, rest: str, voice: SynthesizeVoice | None = None) -> Heard:
    """Home Assistant's streaming sequence, its first chunk alone until audio starts, then the rest word by
    word, the whole text again, and the stop; read until ``synthesize-stopped``."""

    async def run() -> Heard:
        async with AsyncTcpClient(*address) as client:
            await client.write_event(SynthesizeStart(voice=voice).event())
            await client.write_event(SynthesizeChunk(text=first).event())
            heard = await read_until(client, "audio-start")  # the first audio comes before the last text
            assert heard.types()[-1:] == ["audio-start"], heard.types()
            for word in rest.split(" "):
                await client.write_event(SynthesizeChunk(text=word + " ").event())
            await client.write_event(Synthesize(text=first + rest, voice=voice).event())
            await client.write_event(SynthesizeStop().event())
            return await read_until(client, "synthesize-stopped", heard)

    return asyncio.run(run())


def samples(heard: Heard) -> int:
    return len(heard.audio()) // 2


# -- describe, one-shot, streaming ---------------------------------------------------------------------------


def test_describe_answers_info_with_the_tts_program_its_voices_and_streaming(
    gateway: tuple[str, int],
) -> None:
    heard = exchange(gateway, Describe().event(), last="info")
    program = Info.from_event(heard.events[-1]).tts[0]
    assert program.name == "voxgate" and program.installed and program.supports_synthesize_streaming
    assert [(v.name, v.languages, v.installed) for v in program.voices] == [("tone", ["en"], True)]


def test_ping_is_answered_with_pong(gateway: tuple[str, int]) -> None:
    heard = exchange(gateway, Ping(text="hello").event(), last="pong")
    assert Pong.from_event(heard.events[-1]).text == "hello"


def test_one_shot_synthesize_answers_one_audio_start_the_chunks_and_one_audio_stop(
    gateway: tuple[str, int], fake: FakeEngine
) -> None:
    heard = exchange(
        gateway, Synthesize(text=SENTENCES, voice=SynthesizeVoice(name="tone")).event(), last="audio-stop"
    )
    types = heard.types()
    assert types[0] == "audio-start" and types[-1] == "audio-stop"
    assert set(types[1:-1]) == {"audio-chunk"}  # two sentences, one answer: no start or stop between
    start = heard.start()
    assert (start.rate, start.width, start.channels) == (16000, 2, 1)
    assert [r.text for r in fake.requests] == [FIRST.strip(), REST]
    expected = sum(int(len(r.text) * SECONDS_PER_CHAR * 16000) for r in fake.requests)
    assert abs(samples(heard) - expected) <= 2 * 16000 * 0.04  # framing may round each segment


def test_streaming_answers_each_segment_as_it_comes_says_it_once_and_ends_with_synthesize_stopped(
    gateway: tuple[str, int], fake: FakeEngine
) -> None:
    heard = streamed(gateway, FIRST, REST)
    types = heard.types()
    assert types[-1] == "synthesize-stopped" and types.count("synthesize-stopped") == 1
    assert types.count("audio-start") == types.count("audio-stop") == len(fake.requests) == 2
    assert types[types.index("audio-stop") + 1] == "audio-start"  # one start and stop per segment
    # The whole text sent again as synthesize is not spoken a second time.
    assert " ".join(r.text for r in fake.requests) == SENTENCES


def test_requests_on_one_connection_are_answered_in_turn(gateway: tuple[str, int], fake: FakeEngine) -> None:
    async def run() -> tuple[Heard, Heard]:
        async with AsyncTcpClient(*gateway) as client:
            await client.write_event(Synthesize(text="One request.").event())
            await client.write_event(SynthesizeStart().event())
            await client.write_event(SynthesizeChunk(text="Then a stream.").event())
            await client.write_event(SynthesizeStop().event())
            return await read_until(client, "audio-stop"), await read_until(client, "synthesize-stopped")

    one_shot, stream = asyncio.run(run())
    assert one_shot.types()[0] == "audio-start" and "synthesize-stopped" not in one_shot.types()
    types = stream.types()
    assert types[0] == "audio-start" and types[-2:] == ["audio-stop", "synthesize-stopped"]
    assert set(types[1:-2]) == {"audio-chunk"}
    assert [r.text for r in fake.requests] == ["One request.", "Then a stream."]


# -- bad input, refusals, hang-ups ---------------------------------------------------------------------------


def test_bad_events_get_an_error_event_and_the_connection_goes_on(gateway: tuple[str, int]) -> None:
    async def run() -> tuple[Heard, Heard]:
        async with AsyncTcpClient(*gateway) as client:
            await client.write_event(SynthesizeChunk(text="no stream").event())
            await client.write_event(Event(type="synthesize", data={"text": 5}))
            await client.write_event(Event(type="select-program", data={"name": "voxgate"}))  # ignored
            bad = await read_until(client, "error")
            await read_until(client, "error", bad)
            await client.write_event(Synthesize(text="Still here.").event())
            return bad, await read_until(client, "audio-stop")

    bad, good = asyncio.run(run())
    assert [e.code for e in bad.errors()] == ["invalid_state", "invalid_message"]
    assert "synthesize-start" in bad.errors()[0].text
    assert samples(good) > 0


def test_an_unknown_voice_is_an_error_naming_the_voices(gateway: tuple[str, int]) -> None:
    heard = exchange(
        gateway, Synthesize(text="Hello.", voice=SynthesizeVoice(name="nobody")).event(), last="error"
    )
    (error,) = heard.errors()
    assert error.code == "voice_not_found" and "tone" in error.text
    assert samples(exchange(gateway, Synthesize(text="Hello.").event(), last="audio-stop")) > 0  # it goes on


def test_a_voice_of_wyoming_piper_maps_through_the_aliases() -> None:
    aliases = {
        "en_US-lessac-medium": "tone"
    }  # VOXGATE_VOICE_ALIASES, as a user moving from wyoming-piper sets it
    with wyoming_gateway(FakeEngine(), voice_aliases=aliases) as address:
        lessac = SynthesizeVoice(name="en_US-lessac-medium")
        heard = exchange(address, Synthesize(text="Hello.", voice=lessac).event(), last="audio-stop")
    assert heard.errors() == [] and samples(heard) > 0


def test_a_refused_voice_after_a_good_one_is_not_heard_at_all(
    gateway: tuple[str, int], fake: FakeEngine
) -> None:
    async def run() -> tuple[Heard, Heard]:
        async with AsyncTcpClient(*gateway) as client:
            await client.write_event(Synthesize(text="Hello.", voice=SynthesizeVoice(name="tone")).event())
            first = await read_until(client, "audio-stop")
            await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="nobody")).event())
            await client.write_event(SynthesizeChunk(text="Not in the old voice.").event())
            await client.write_event(SynthesizeStop().event())
            return first, await read_until(client, "synthesize-stopped")

    first, refused = asyncio.run(run())
    assert samples(first) > 0
    assert refused.types() == ["error", "synthesize-stopped"]
    assert [r.text for r in fake.requests] == ["Hello."]


def test_a_stream_that_is_not_wyoming_gets_an_error_and_is_closed(gateway: tuple[str, int]) -> None:
    async def run() -> Heard:
        reader, writer = await asyncio.open_connection(*gateway)
        writer.write(b"GET / HTTP/1.1\r\n\r\n")
        await writer.drain()
        heard = Heard()
        while line := await asyncio.wait_for(reader.readline(), TIMEOUT_S):
            heard.events.append(Event(type=line.decode()))
        writer.close()
        return heard

    heard = asyncio.run(run())
    assert len(heard.events) == 2 and '"type":"error"' in heard.events[0].type  # the error's header, its data
    assert "invalid_json" in heard.events[1].type
    assert samples(exchange(gateway, Synthesize(text="Hello.").event(), last="audio-stop")) > 0


def test_a_client_that_hangs_up_mid_stream_stops_the_engine() -> None:
    fake = FakeEngine(delay_s=0.1)  # 250 ms of audio every 100 ms: each sentence takes 0.7 s, the text 28 s

    async def run(address: tuple[str, int]) -> None:
        async with AsyncTcpClient(*address) as client:
            await client.write_event(SynthesizeStart().event())
            await client.write_event(SynthesizeChunk(text="This sentence goes on and on. " * 40).event())
            await read_until(client, "audio-chunk")  # then it hangs up

    with wyoming_gateway(fake) as address:
        asyncio.run(run(address))
        deadline = time.monotonic() + TIMEOUT_S
        while fake.closed < fake.started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fake.started >= 1 and fake.closed == fake.started
        assert fake.finished == 0  # the engine was stopped in the first sentence, not run to the end
        started = fake.started
        time.sleep(0.3)
        assert fake.started == started  # and nothing more was started for the gone client


def test_the_session_limits_hold_and_the_connection_goes_on() -> None:
    engine = FakeEngine(fail_on="boom", fail_after_chunks=1)
    limits = {
        "max_pending_text_chars": 100,
        "max_segment_audio_base_s": 0.5,
        "max_segment_audio_per_char_s": 0,
    }

    async def run(address: tuple[str, int]) -> list[Heard]:
        async with AsyncTcpClient(*address) as client:
            heard = []
            for text in (
                "Words upon words. " * 6,
                "Then boom here.",
                "A sentence longer than its cap.",
                "Fine.",
            ):
                await client.write_event(Synthesize(text=text).event())
                heard.append(await read_until(client, "audio-stop"))
            await client.write_event(Event(type="synthesize", data={"text": "x" * 200_000}))
            await client.write_event(Synthesize(text="Fine.").event())
            heard.append(await read_until(client, "audio-stop"))
            return heard

    with wyoming_gateway(engine, **limits) as address:
        over, failed, capped, fine, skipped = asyncio.run(run(address))
    assert ([e.code for e in over.errors()], samples(over)) == (["text_backlog_full"], 0)
    assert [e.code for e in failed.errors()] == ["engine_error"] and samples(failed) > 0  # what came before
    assert [e.code for e in capped.errors()] == ["audio_truncated"] and samples(capped) == 0.5 * 16000
    assert (fine.errors(), skipped.types()[0]) == ([], "error")
    assert [e.code for e in skipped.errors()] == ["message_too_large"] and samples(skipped) > 0


def test_past_max_sessions_a_connection_gets_server_busy_and_is_closed() -> None:
    async def run(address: tuple[str, int]) -> Heard:
        async with AsyncTcpClient(*address) as holder:
            await holder.write_event(SynthesizeStart().event())  # a session is open
            await holder.write_event(SynthesizeChunk(text="Hello there. ").event())
            await read_until(holder, "audio-start")
            async with AsyncTcpClient(*address) as refused:
                return await read_until(refused, "never")

    with wyoming_gateway(FakeEngine(), max_sessions=1) as address:
        heard = asyncio.run(run(address))
    assert [e.code for e in heard.errors()] == ["server_busy"] and len(heard.events) == 1


def test_a_connection_that_asks_for_nothing_is_closed_after_the_config_timeout() -> None:
    async def run(address: tuple[str, int]) -> Heard:
        async with AsyncTcpClient(*address) as client:
            await client.write_event(Describe().event())
            return await read_until(client, "never")  # describe does not start the session

    with wyoming_gateway(FakeEngine(), config_timeout_s=0.2) as address:
        heard = asyncio.run(run(address))
    assert heard.types() == ["info", "error"] and heard.errors()[0].code == "config_timeout"


# -- the address, the flag and the variable ------------------------------------------------------------------


def test_addresses_listen_on_loopback_unless_they_name_a_host() -> None:
    assert parse_address("10200") == ("127.0.0.1", 10200)
    assert parse_address(":10200") == ("127.0.0.1", 10200)
    assert parse_address("0.0.0.0:10200") == ("0.0.0.0", 10200)
    assert parse_address("[::1]:10200") == ("::1", 10200)
    for bad in ("", "host", "host:port", "1:99999"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_address(bad)


def test_serve_takes_wyoming_from_the_flag_or_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = build_parser().parse_args(["serve", "--wyoming", "0.0.0.0:10200"])
    assert Settings.from_env({}, **{k: v for k, v in vars(args).items() if k != "command"}).wyoming == (
        "0.0.0.0:10200"
    )
    assert Settings.from_env({"VOXGATE_WYOMING": "10200"}).wyoming == "10200"
    assert Settings.from_env({}).wyoming == ""  # none unless asked
    monkeypatch.setenv("VOXGATE_WYOMING", "not-an-address")
    assert main(["serve", "--engine", "fake"]) == 2
    assert "is not HOST:PORT" in capsys.readouterr().err
    with pytest.raises(ValueError, match="HOST:PORT"):
        create_app(Settings.from_env({}, wyoming="nowhere"), engine=FakeEngine())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_voxgate_serve_runs_wyoming_beside_http_and_its_api_keys_do_not_apply(tmp_path: Path) -> None:
    http, tcp = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
    env.update(
        VOXGATE_API_KEYS="secret", VOXGATE_VOICES_DIR=str(tmp_path), VOXGATE_WYOMING=f"127.0.0.1:{tcp}"
    )
    argv = [sys.executable, "-c", "import sys; from voxgate.cli import main; sys.exit(main())"]
    with subprocess.Popen(
        [*argv, "serve", "--engine", "fake", "--port", str(http)], env=env, stderr=subprocess.PIPE
    ) as server:
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while True:
                try:
                    heard = exchange(("127.0.0.1", tcp), Synthesize(text="Hello.").event(), last="audio-stop")
                    break
                except OSError:
                    assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
                    time.sleep(0.1)
            refused = urllib.request.Request(f"http://127.0.0.1:{http}/v1/audio/voices")
            with pytest.raises(urllib.error.HTTPError, match="401"):
                urllib.request.urlopen(refused, timeout=TIMEOUT_S)  # the HTTP side wants its key
        finally:
            server.send_signal(signal.SIGTERM)
            _, err = server.communicate(timeout=TIMEOUT_S)
    assert heard.errors() == [] and samples(heard) > 0  # Wyoming has no key to give
    assert f"Wyoming server on 127.0.0.1:{tcp} (no authentication" in err.decode()
    assert server.returncode == 0


# -- Piper, heard with Whisper -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def piper() -> Iterator[tuple[str, int]]:
    with wyoming_gateway(None, engine="piper", piper_workers=1) as address:
        yield address


@pytest.fixture(scope="module")
def whisper() -> object:
    return load_whisper()


def heard_text(whisper: object, heard: Heard) -> tuple[float, str]:
    start = heard.start()
    assert (start.width, start.channels) == (2, 1)
    return word_error_rate(whisper, decode(heard.audio(), "pcm"), start.rate, SENTENCES)


@pytest.mark.slow
def test_piper_one_shot_is_heard(piper: tuple[str, int], whisper: object) -> None:
    describe = Info.from_event(exchange(piper, Describe().event(), last="info").events[-1])
    voice = describe.tts[0].voices[0].name
    heard = exchange(
        piper, Synthesize(text=SENTENCES, voice=SynthesizeVoice(name=voice)).event(), last="audio-stop"
    )
    assert heard.types().count("audio-start") == 1
    error, text = heard_text(whisper, heard)
    assert error < 0.25, text


@pytest.mark.slow
def test_piper_stream_starts_before_its_last_text_and_is_heard_once(
    piper: tuple[str, int], whisper: object
) -> None:
    heard = streamed(piper, FIRST, REST)  # the first audio-start is read before the rest is written
    assert heard.types()[-1] == "synthesize-stopped"
    error, text = heard_text(whisper, heard)
    assert error < 0.25, text  # said once: a second time would double the words Whisper hears
