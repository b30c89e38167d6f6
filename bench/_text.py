"""The text the benches speak, and how they stream it as an LLM would."""

from __future__ import annotations

import random

# Four sentences: about 20 s of Piper's speech (23 s of the fake engine's tone) in 5 segments. Enough
# segments for gaps between them to show, short enough for many runs on two cores.
PARAGRAPH = (
    "The gateway turns a stream of words into speech while the model is still writing its answer. "
    "Each sentence is spoken as soon as it ends, so the listener hears the first words almost at once. "
    "Short pauses between sentences sound natural, but a gap in the middle of a thought sounds broken. "
    "This benchmark measures how quickly the first sound arrives and whether playback ever runs dry."
)
# LLM tokenizers emit pieces of about this size for English prose.
TOKEN_CHARS = (2, 5)
# Fixed, so every run (and every machine) streams exactly the same token boundaries.
TOKEN_SEED = 7


def tokenize(text: str, seed: int = TOKEN_SEED) -> list[str]:
    """Cut ``text`` into LLM-like tokens of 2-5 characters (deterministic for a given seed)."""
    rng = random.Random(seed)
    tokens, i = [], 0
    while i < len(text):
        n = rng.randint(*TOKEN_CHARS)
        tokens.append(text[i : i + n])
        i += n
    return tokens
