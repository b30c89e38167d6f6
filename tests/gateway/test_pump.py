"""The engine pump on its own, with a writer of the test's: what it hands out first while a listener waits."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import numpy as np
import pytest
from voxgate.engine.fake import SECONDS_PER_CHAR, FakeEngine
from voxgate.gateway.metrics import Metrics
from voxgate.gateway.session.jobs import Utterance
from voxgate.gateway.session.outbox import Outbox
from voxgate.gateway.session.pump import FIRST_SLICE_S, Pump
from voxgate.protocol.core import Core
from voxgate.protocol.messages import InputDone, InputText, SessionConfig, SessionDone
from voxgate.protocol.output import Audio, Message, OutputFormat

from tests.conftest import TIMEOUT_S
from tests.decoding import decoded

RATE = 24000
TEXT = "Hello there, this sentence is long enough."  # one segment, one chunk of 2.5 s


class _Recording(Core):
    """A core that notes how many samples of engine audio it was given, call by call."""

    given: list[int]

    def audio(
        self,
        utterance: int,
        sentence: int,
        samples: np.typing.NDArray[np.float32],
        sample_rate: int,
        words: Sequence[tuple[str, int, int]] = (),
    ) -> None:
        self.given.append(len(samples))
        super().audio(utterance, sentence, samples, sample_rate, words)


async def _started(
    fmt: str, text: str, chunk_s: float = 60.0, delay_s: float = 0.0
) -> tuple[_Recording, Outbox, asyncio.Task[None]]:
    """A core given ``text`` as one utterance in ``fmt``, and its pump running with engine chunks of
    ``chunk_s`` (by default one long chunk per segment), each after ``delay_s``; nothing reads the outbox
    yet."""
    engine = FakeEngine(sample_rate=RATE, chunk_s=chunk_s, delay_s=delay_s)
    fmt_out = OutputFormat(fmt, RATE).check()  # type: ignore[arg-type]
    core = _Recording(fmt_out)
    core.given = []
    config = SessionConfig(response_format=fmt, sample_rate=RATE)  # type: ignore[arg-type]
    core.receive_message(config, 0.0)
    core.accept_config(config, fmt_out)
    core.data_to_send()
    core.receive_message(InputText(text=text), 0.0)
    core.receive_message(InputDone(), 0.0)
    outbox = Outbox(max_audio_s=30.0)
    pump = Pump(
        core,
        outbox,
        Metrics().session("test"),
        lambda index: Utterance(index, config, engine, "tone", None, {}),
        logging.getLogger("test"),
    )
    await pump.route(core.data_to_send())
    return core, outbox, asyncio.create_task(pump.run())


async def _speak(
    fmt: str, text: str = TEXT, chunk_s: float = 60.0, delay_s: float = 0.0
) -> tuple[list[int], list[bytes], list[int]]:
    """Speak ``text`` (by default with one long engine chunk), writing as fast as the pump gives; returns
    the samples the core had been given when the writer took the first audio, every audio payload, and
    every engine slice."""
    core, outbox, runner = await _started(fmt, text, chunk_s, delay_s)
    given_at_first: list[int] | None = None
    payloads: list[bytes] = []
    try:
        while True:
            output = core.sending(await outbox.get(), time.perf_counter())  # as a writer does
            match output:
                case Audio(data=data):
                    if given_at_first is None:
                        given_at_first = list(core.given)
                    payloads.append(data)
                case Message(msg=SessionDone()):
                    break
    finally:
        runner.cancel()
        await asyncio.wait([runner])
    assert given_at_first is not None
    return given_at_first, payloads, core.given


@pytest.mark.parametrize("fmt", ["opus", "mp3", "pcm"])
def test_the_first_slice_is_written_before_the_rest_of_a_long_chunk_is_encoded(fmt: str) -> None:
    given_at_first, payloads, given = asyncio.run(_speak(fmt))
    head = round(FIRST_SLICE_S * RATE)
    expected = round(len(TEXT) * SECONDS_PER_CHAR * RATE)
    # The writer had the first slice's bytes while the core had been given only that slice.
    assert given_at_first == [head]
    assert given == [head, expected - head]
    audio = b"".join(payloads)
    if fmt == "pcm":
        assert len(audio) == 2 * expected
    else:  # one stream: the slices join seamlessly, give or take the codec's padding
        samples, rate = decoded(audio)
        assert len(samples) / rate == pytest.approx(expected / RATE, abs=0.06)  # Opus decodes at 48 kHz


def test_a_chunk_is_not_sliced_while_the_listener_has_audio_to_play() -> None:
    # An engine faster than real time (vllm-omni's chunks: here 2 s each, 20 ms apart), and a writer
    # that takes each at once: the outbox is empty whenever a chunk comes, but only the first finds a
    # listener waiting. The others go to the core, and so to the socket, in one piece each.
    text = "This sentence is a good deal longer, long enough for several chunks of audio."
    _, payloads, given = asyncio.run(_speak("pcm", text, chunk_s=2.0, delay_s=0.02))
    head, step = round(FIRST_SLICE_S * RATE), int(2.0 * RATE)
    total = int(len(text) * SECONDS_PER_CHAR * RATE)
    assert total > 2 * step  # two chunks after the first
    chunks = [min(step, total - i) for i in range(0, total, step)]
    assert given == [head, chunks[0] - head, *chunks[1:]]
    assert len(b"".join(payloads)) == 2 * total


def test_a_chunk_is_not_sliced_while_audio_waits_for_the_writer() -> None:
    async def scenario() -> list[int]:
        # Two sentences, two segments; no writer reads, so the first one's audio is still queued.
        core, _, runner = await _started("pcm", f"{TEXT} {TEXT}")
        async with asyncio.timeout(TIMEOUT_S):
            while len(core.given) < 3:  # noqa: ASYNC110 - the pump has no event for a core call
                await asyncio.sleep(0.01)
        runner.cancel()
        await asyncio.wait([runner])
        return core.given

    head = round(FIRST_SLICE_S * RATE)
    expected = round(len(TEXT) * SECONDS_PER_CHAR * RATE)
    # The first segment waits FIRST_SLICE_S for a writer that never comes, then goes on whole; the second
    # segment's chunk finds audio queued and goes to the core in one piece.
    assert asyncio.run(scenario()) == [head, expected - head, expected]
