"""A hypothesis fuzz of the session core: random client messages, valid and hostile, mixed with engine events.

A small model shell drives ``protocol.core.Core`` the way ``gateway/transport/socket.py`` does: it accepts
configs (or refuses those for voice ``nobody``, as the engines would), queues ``Speak`` for a model
engine that starts, feeds and finishes segments (or fails them) when the fuzz says so, keeps an outbox
that a ``Drop`` prunes, and writes outputs through ``Core.sending``. Invariants checked on every run:

- nothing but ``ProtocolError`` escapes; an error is fatal exactly while no config is accepted (then
  the session ends), and its code is in the error table;
- every utterance the session numbered gets exactly one ``session.done``, or is cancelled
  (``audio.cancelled``), never both, once the session is closed and the engine has finished;
- outputs come in order: a segment's ``audio.start``, its frames, its ``audio.done``; an utterance's
  ``session.done`` after its segments' and after every earlier utterance's; ``Finish`` last;
- frames have the configured size (the last of a segment may be shorter), their headers say whose they
  are, and the bytes written add up to ``audio.done.total_bytes`` (nothing lost, nothing extra).
"""

from __future__ import annotations

import collections
import json
import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from voxgate.protocol.audio import BYTES_PER_SAMPLE
from voxgate.protocol.core import Core
from voxgate.protocol.errors import FAILURES, ErrorCode, ProtocolError
from voxgate.protocol.frames import FrameHeader
from voxgate.protocol.messages import (
    AudioCancelled,
    AudioDone,
    AudioStart,
    Error,
    SessionConfig,
    SessionDone,
)
from voxgate.protocol.output import (
    Audio,
    Configure,
    Drop,
    Finish,
    Message,
    Output,
    OutputFormat,
    Report,
    Speak,
)
from voxgate.protocol.session import Session, State

ENGINE_RATE = 22050
HEADER_BYTES = 24
MAX_MESSAGE_BYTES = 512
MAX_CONFIG_BYTES = 2048

# -- client messages --------------------------------------------------------------------------------

_words = st.text(alphabet="abc xyz.,!?;:\u00e9\u4e2d\U0001f600\n", max_size=40)
_json_scalar = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
_json_any = st.recursive(
    _json_scalar,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_types = st.sampled_from(
    [
        "session.config",
        "input.text",
        "input.done",
        "input.commit",
        "input.cancel",
        "session.close",
        "nope",
        "",
    ]
)


def _config(voices: tuple[str, ...] = ("tone", "nobody")) -> st.SearchStrategy[dict[str, object]]:
    return st.fixed_dictionaries(
        {"type": st.just("session.config")},
        optional={
            "voice": st.sampled_from(voices),
            "response_format": st.sampled_from(["pcm", "f32", "mulaw"]),
            "sample_rate": st.sampled_from([8000, 16000, 24000]),
            "frame_ms": st.sampled_from([10, 40, 100]),
            "frame_header": st.booleans(),
            "split_granularity": st.sampled_from(["sentence", "clause", "none"]),
            "eager_first_segment": st.booleans(),
            "max_buffer_delay_ms": st.integers(0, 500),
            "unknown_field": _json_scalar,
        },
    )


_valid = st.one_of(
    _config(),
    st.builds(lambda t: {"type": "input.text", "text": t}, _words),
    st.builds(lambda t: {"type": "input.text", "text": t}, _words),  # text more often than the rest
    st.just({"type": "input.done"}),
    st.builds(lambda c: {"type": "input.commit", "commit_id": c}, st.none() | st.text(max_size=6)),
    st.just({"type": "input.cancel"}),
    st.just({"type": "session.close"}),
)
_hostile_text = st.one_of(
    st.text(max_size=60),  # mostly not JSON
    st.builds(json.dumps, _json_any),  # JSON of any shape
    st.builds(lambda t, v: json.dumps({"type": t, "text": v, "voice": v}), _types, _json_any),  # wrong types
    st.builds(lambda n: "[" * n + "]" * n, st.integers(1, 3000)),  # deep nesting
    st.builds(lambda n: '{"type": "input.text", "text": ' + "[" * n + "]" * n + "}", st.integers(500, 3000)),
    st.builds(
        lambda n: json.dumps({"type": "input.text", "text": "x" * n}), st.integers(400, 3000)
    ),  # oversize
    st.builds(
        lambda n: json.dumps({"type": "session.config", "instructions": "x" * n}), st.integers(1500, 3000)
    ),
    st.just('{"type": "input.text", "text": "\\ud800"}'),  # a lone surrogate, escaped (raw ones never
)  # reach the core: the server decodes a text message as strict UTF-8, or closes with 1007)
Action = tuple[str, object]
_engine = st.one_of(
    st.tuples(st.just("start"), st.none()),
    st.tuples(st.just("audio"), st.integers(0, 3000)),
    st.tuples(st.just("done"), st.booleans()),
    st.tuples(st.just("tick"), st.floats(0.0, 1.0)),
    st.tuples(st.just("write"), st.integers(1, 20)),
)
_sentences = st.lists(
    st.sampled_from(["Hello there.", "How are you?", "Fine, thanks", "ok", "\u4e2d\u6587\u3002"])
)
_actions = st.lists(
    st.one_of(
        st.tuples(st.just("say"), _sentences.map(" ".join)),
        st.tuples(st.just("send"), _config(("tone",)).map(json.dumps)),  # a new format, accepted
        st.tuples(st.just("send"), st.just('{"type": "input.cancel"}')),  # barge-in, often
        st.tuples(st.just("send"), _valid.map(json.dumps)),
        _engine,
        _engine,  # the engine and the writer act as often as the client sends
        st.tuples(st.just("send"), _hostile_text),
        st.tuples(st.just("bytes"), st.binary(max_size=40)),
    ),
    min_size=5,
    max_size=80,
)

# -- the model shell --------------------------------------------------------------------------------


class Shell:
    """Drives a Core as gateway/transport/socket.py does, synchronously, with a model engine."""

    def __init__(self, *, extensions: bool, max_pending: int) -> None:
        session = Session(
            max_config_bytes=MAX_CONFIG_BYTES,
            max_message_bytes=MAX_MESSAGE_BYTES,
            max_pending_text_chars=max_pending,
            extensions=extensions,
        )
        self.core = Core(OutputFormat("pcm", 24000), session)
        self.fmt = OutputFormat("pcm", 24000)
        self.fmt_of: dict[int, OutputFormat] = {}  # each utterance's format, from its first text
        self.jobs: collections.deque[tuple[int, int]] = collections.deque()
        self.current: tuple[int, int] | None = None
        self.outbox: collections.deque[Output] = collections.deque()
        self.written: list[Output] = []
        self.now = 0.0
        self.dead = False  # a fatal error ended the session
        self.finished = False  # Finish was written

    # client side
    def receive(self, data: str | bytes) -> None:
        if self.dead or self.finished:
            return
        configured = self.core.session.configured
        try:
            if isinstance(data, bytes):
                self.core.receive_bytes(data, self.now)
            else:
                self.core.receive_text(data, self.now)
            # Utterances numbered by this message speak the format in force now (a config can only
            # change while no utterance is open).
            for u in range(len(self.fmt_of), self.core.session.utterance_index):
                self.fmt_of[u] = self.fmt
            self.flush()
        except ProtocolError as error:
            assert error.code in FAILURES and error.message
            assert error.fatal == (not configured), "fatal exactly while no config is accepted"
            if error.fatal:
                self.dead = True

    def configure(self, config: SessionConfig) -> None:
        if config.voice == "nobody":
            error = ProtocolError(ErrorCode.VOICE_NOT_FOUND, "no voice 'nobody'")
            raise self.core.reject_config(error)
        rate = config.output_rate(ENGINE_RATE)
        self.fmt = OutputFormat(
            config.response_format, rate, config.frame_ms, config.frame_header, config.streamed
        )
        self.core.accept_config(config, self.fmt)

    def flush(self) -> None:
        for output in self.core.data_to_send():
            match output:
                case Configure(config=config):
                    self.configure(config)
                case Speak(utterance=u, sentence=s):
                    self.jobs.append((u, s))
                case Drop(utterances=victims):
                    self.jobs.clear()
                    self.current = None  # the engine's task is cancelled: it reports nothing more
                    doomed = set(victims)
                    self.outbox = collections.deque(
                        o
                        for o in self.outbox
                        if not (isinstance(o, Audio | Message | Report) and o.utterance in doomed)
                    )
                case _:
                    self.outbox.append(output)

    # engine side
    def start(self) -> None:
        if self.current is None and self.jobs and not self.dead:
            self.current = self.jobs.popleft()
            self.core.segment_started(*self.current)
            self.flush()

    def audio(self, n: int) -> None:
        if self.current is not None and not self.dead:
            samples = np.sin(np.arange(n, dtype=np.float32) / 7).astype(np.float32) * 0.3
            self.core.audio(*self.current, samples, ENGINE_RATE)
            self.flush()

    def done(self, failed: bool) -> None:
        if self.current is not None and not self.dead:
            error = ProtocolError(ErrorCode.ENGINE_ERROR, "engine down") if failed else None
            self.core.segment_done(*self.current, synthesis_s=0.01, error=error)
            self.current = None
            self.flush()

    def tick(self, dt: float) -> None:
        self.now += dt
        if not self.dead:
            deadline = self.core.next_deadline()
            assert deadline is None or math.isfinite(deadline)
            self.core.tick(self.now)
            self.flush()

    # writer
    def write(self, n: int) -> None:
        while n and self.outbox and not self.dead and not self.finished:
            n -= 1
            output = self.core.sending(self.outbox.popleft(), self.now)
            if output is None:
                continue
            assert not isinstance(output, Report), "a Report is always turned into a message or None"
            self.written.append(output)
            if isinstance(output, Finish):
                self.finished = True

    def run_out(self) -> None:
        """Close (if alive), let the engine finish everything, and write it all."""
        if not self.dead and not self.finished and self.core.session.state in (State.READY, State.SPEAKING):
            self.receive(json.dumps({"type": "session.close"}))
        for _ in range(10_000):
            if self.dead or self.finished:
                break
            if self.current is not None:
                self.audio(500)
                self.done(False)
            elif self.jobs:
                self.start()
            elif self.outbox:
                self.write(1000)
            elif self.core.next_deadline() is not None:
                self.tick(1.0)
            else:
                break


def check(shell: Shell) -> None:
    assert all(not isinstance(o, Finish) for o in shell.written[:-1]), "Finish comes last"
    done_count: collections.Counter[int] = collections.Counter()
    cancelled: set[int] = set()
    last_done = -1
    started: set[tuple[int, int]] = set()
    finished: set[tuple[int, int]] = set()
    frames: dict[tuple[int, int], list[bytes]] = collections.defaultdict(list)
    for output in shell.written:
        if isinstance(output, Audio):
            key = (output.utterance, output.sentence)
            assert key in started and key not in finished, f"frame outside its segment {key}"
            frames[key].append(output.data)
            continue
        if not isinstance(output, Message):
            continue
        match output.msg:
            case AudioStart(utterance_index=u, sentence_index=s):
                assert (u, s) not in started and u not in cancelled and not done_count[u]
                started.add((u, s))
            case AudioDone(utterance_index=u, sentence_index=s, total_bytes=total):
                assert (u, s) in started and (u, s) not in finished
                finished.add((u, s))
                _check_frames(shell.fmt_of[u], u, s, frames[(u, s)], total)
            case SessionDone(utterance_index=u, total_sentences=n):
                assert u > last_done, "session.done in utterance order"
                last_done = u
                done_count[u] += 1
                assert {(u, s) for s in range(n)} <= finished, "session.done after its audio.done"
                assert not any(k[0] == u for k in started - finished)
            case AudioCancelled(utterance_index=u):
                if u is not None:
                    cancelled.add(u)
            case Error(utterance_index=u):
                assert u is None or any(k[0] == u for k in finished)
    assert all(n == 1 for n in done_count.values())
    assert not (set(done_count) & cancelled), "an utterance is either done or cancelled"
    if shell.finished:
        # Every utterance the session numbered got its answer.
        numbered = range(shell.core.session.utterance_index)
        assert set(numbered) == set(done_count) | cancelled
        assert shell.core.in_flight == ()


def _check_frames(fmt: OutputFormat, u: int, s: int, data: list[bytes], total_bytes: int) -> None:
    header = HEADER_BYTES if fmt.frame_header else 0
    payloads = [d[header:] for d in data]
    assert sum(len(p) for p in payloads) == total_bytes, "every byte of the segment written, none more"
    if fmt.frame_header:
        for i, d in enumerate(data):
            parsed = FrameHeader.parse(d)
            assert (parsed.utterance_index, parsed.sentence_index) == (u, s)
            assert i == 0 or parsed.frame_index > FrameHeader.parse(data[i - 1]).frame_index
    if fmt.streamed:
        full = max(1, round(fmt.sample_rate * fmt.frame_ms / 1000)) * BYTES_PER_SAMPLE[fmt.fmt]
        assert all(len(p) == full for p in payloads[:-1]), "frames of frame_ms"
        assert all(0 < len(p) <= full for p in payloads[-1:])


@settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    actions=_actions,
    extensions=st.booleans(),
    max_pending=st.sampled_from([0, 30, 200]),
    configured=st.integers(0, 7),
)
def test_the_core_survives_any_sequence_and_keeps_its_promises(
    actions: list[Action], extensions: bool, max_pending: int, configured: int
) -> None:
    shell = Shell(extensions=extensions, max_pending=max_pending)
    if configured:  # most runs start configured: before that, any error ends the session
        shell.receive(json.dumps({"type": "session.config"}))
    for kind, arg in actions:
        match kind:
            case "send":
                assert isinstance(arg, str)
                shell.receive(arg)
            case "say":  # a whole utterance
                assert isinstance(arg, str)
                shell.receive(json.dumps({"type": "input.text", "text": arg}))
                shell.receive(json.dumps({"type": "input.done"}))
            case "bytes":
                assert isinstance(arg, bytes)
                shell.receive(arg)
            case "start":
                shell.start()
            case "audio":
                assert isinstance(arg, int)
                shell.audio(arg)
            case "done":
                shell.done(bool(arg))
            case "tick":
                assert isinstance(arg, float)
                shell.tick(arg)
            case "write":
                assert isinstance(arg, int)
                shell.write(arg)
        check(shell)
    shell.run_out()
    check(shell)
    if not shell.dead and shell.core.session.configured:
        assert shell.finished, "a configured session that was not killed closes normally"
