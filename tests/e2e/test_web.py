"""The browser demo page (web/) in a real headless Chromium against a real gateway with Piper.

The page's counters on ``window.voxgate`` are the probe: frames received, samples the AudioWorklet
actually played (counted inside the worklet), cancellations, the last error shown, the bit rate received
and, for Opus, the WebCodecs decoder's counters (``window.voxgate.decoder``, from web/opus.js).
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile
from voxgate.engine.fake import FakeEngine
from voxgate.protocol.encoders import StreamEncoder

from tests.conftest import TIMEOUT_S, serve_engine

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(
        f"the demo page's browser tests need {CHROMIUM} (apt-get install -y chromium; .ci/run installs it)",
        allow_module_level=True,
    )
try:
    from playwright.sync_api import Browser, Page, sync_playwright
except ImportError:
    pytest.skip("the playwright package is missing (pip install playwright)", allow_module_level=True)

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--autoplay-policy=no-user-gesture-required",
    # A fake microphone (a beeping tone) that needs no permission prompt, for the record button.
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
]
WAIT_MS = TIMEOUT_S * 1000
PARAGRAPH = (
    "The gateway speaks while the text is still arriving. "
    "Each sentence becomes audio as soon as it is complete. "
    "This one comes last."
)
LONG_PARAGRAPH = " ".join(
    [
        "This paragraph is long on purpose, so that there is still plenty left to say when the stop button",
        "is pressed. The gateway turns every sentence into speech as soon as it is complete, and the page",
        "plays it through an audio worklet with a small jitter buffer. Nobody should hear the rest of it,",
        "because stopping cancels the utterance on the server and flushes the buffer in the page at once.",
        "If you can hear this sentence, the stop button did not work. Neither should you hear this one.",
    ]
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # launch() gives the browser a fresh temporary profile of its own and removes it on close.
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    crashes: list[str] = []
    page.on("pageerror", lambda exc: crashes.append(str(exc)))
    # The gateway's Content-Security-Policy must allow everything the page does. (Predicates passed to
    # wait_for_function are functions, not strings: a string would be eval'd in the page, which the CSP
    # rightly refuses.)
    csp = "Content Security Policy"
    page.on("console", lambda msg: crashes.extend([msg.text] if csp in msg.text else []))
    yield page
    context.close()
    assert crashes == [], f"uncaught errors or CSP violations in the page: {crashes}"


def voxgate(page: Page) -> dict[str, Any]:
    """A snapshot of the page's counters (segments without the holes of a sparse array)."""
    state: dict[str, Any] = page.evaluate(
        "({...window.voxgate, segments: window.voxgate.segments.filter(Boolean)})"
    )
    return state


def open_page(page: Page, address: str) -> None:
    page.goto(f"http://{address}/")
    # The built-in voices are listed once the page has called GET /v1/audio/voices.
    page.wait_for_function(
        "() => document.querySelectorAll('#voice optgroup option').length > 0", timeout=WAIT_MS
    )


def set_token_rate(page: Page, per_second: int) -> None:
    page.eval_on_selector(
        "#token-rate", "(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }", per_second
    )


def write_wav(path: Path, seconds: float, rate: int = 22050) -> Path:
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(7)
    signal = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(t.size)
    soundfile.write(path, signal.astype(np.float32), rate, subtype="PCM_16")
    return path


def test_page_is_labelled_and_keyboard_usable(page: Page, piper_gateway: str) -> None:
    open_page(page, piper_gateway)
    unlabelled = page.evaluate(
        """[...document.querySelectorAll('input, select, textarea, button')]
             .filter(el => el.type !== 'hidden' && !el.hidden)
             .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label')
                           && !(el.tagName === 'BUTTON' && el.textContent.trim()))
             .map(el => el.id || el.outerHTML)"""
    )
    assert unlabelled == []
    assert page.locator("[aria-live]").count() >= 2
    page.keyboard.press("Tab")  # the skip link, then the controls in order
    assert page.evaluate("document.activeElement.className") == "skip"


def poll(page: Page, expression: str) -> None:
    """Wait, polling from here (the page's own timers may be paused), until ``expression`` is true."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while not page.evaluate(expression):
        assert time.monotonic() < deadline, f"timed out waiting for {expression}"
        time.sleep(0.02)


def test_speaks_a_paragraph_in_llm_mode(page: Page, piper_gateway: str, output_dir: Path) -> None:
    # A paced fake: the page's clock stands still while the server works, and tokens are all 2
    # characters, so the order of events is fixed whatever the machine's load.
    page.add_init_script("Math.random = () => 0")
    page.clock.install()
    open_page(page, piper_gateway)
    page.fill("#text", PARAGRAPH)
    page.check("input[name=mode][value=llm]")
    set_token_rate(page, 25)
    page.clock.pause_at(page.evaluate("Date.now()") + 1000)
    page.click("#speak-btn")
    poll(page, "window.voxgate.state === 'speaking'")  # the feed has sent its first token
    page.clock.run_for(27 * 40)  # 28 tokens of 2 characters: the first sentence and "Ea"
    poll(page, "window.voxgate.framesReceived > 0")  # its audio arrives before any more text is sent
    page.clock.run_for(37 * 40)  # then the other 36 tokens and input.done at once, so the later
    page.clock.resume()  # sentences are synthesized well within the first one's playback
    page.wait_for_function(
        "() => window.voxgate.sessionsDone >= 1 && window.voxgate.secondsPlayed >= 2", timeout=WAIT_MS
    )
    page.screenshot(path=output_dir / "web-1280.png", full_page=True)

    state = voxgate(page)
    assert state["framesReceived"] > 20 and state["bytesReceived"] > 20 * 24
    assert isinstance(state["ttfaMs"], int) and 0 < state["ttfaMs"] < 10_000
    assert re.fullmatch(r"\d+", page.inner_text("#ttfa"))
    segments = state["segments"]
    assert isinstance(segments, list) and len(segments) >= 3
    assert " ".join(s["text"] for s in segments) == PARAGRAPH
    # The first sentence is heard before the end of the text was sent.
    assert segments[0]["firstAudioMs"] < segments[-1]["textReadyMs"]
    assert page.locator("#timeline-body tr").count() == len(segments)
    for segment in segments:
        assert page.locator("#timeline-body tr", has_text=segment["text"]).count() == 1
    ready = state["ready"]
    assert isinstance(ready, dict) and ready["config"]["engine"] == "piper"
    assert page.locator("#session-info").inner_text().count("piper") == 1

    # Every sample that arrived is played, with no gap between segments: the worklet's count
    # ends at the utterance's audio length (resampling aside, within a few render quanta).
    page.wait_for_function("() => window.voxgate.state === 'idle'", timeout=WAIT_MS)
    state = voxgate(page)
    audio_s = sum(s["durationMs"] for s in state["segments"]) / 1000
    assert state["secondsPlayed"] == pytest.approx(audio_s, abs=0.05)
    assert state["underruns"] == 0

    page.set_viewport_size({"width": 360, "height": 800})
    page.wait_for_timeout(200)
    assert page.evaluate("document.documentElement.scrollWidth") <= 360
    page.screenshot(path=output_dir / "web-360.png", full_page=True)


def test_the_markdown_sample_is_spoken_item_by_item(page: Page, piper_gateway: str) -> None:
    """The page's "Markdown reply" sample: each list item is its own segment, named in the client's own
    characters (markup included), and it plays through without an error."""
    open_page(page, piper_gateway)
    page.select_option("#sample", "markdown")
    text = page.input_value("#text")
    assert text.startswith("**Sure!**") and "\n1. *Pizza*" in text
    page.check("input[name=mode][value=whole]")
    page.click("#speak-btn")
    page.wait_for_function(
        "() => window.voxgate.sessionsDone >= 1 && window.voxgate.state === 'idle'", timeout=WAIT_MS
    )
    state = voxgate(page)
    assert state["errors"] == []
    texts = [s["text"] for s in state["segments"]]
    for item in ("1. *Pizza* for $12.99", "3. ~~Tacos~~ Burgers."):
        assert [t for t in texts if item in t] == [item], texts  # alone in its segment
    assert all(t in text for t in texts)
    page.select_option("#sample", "greeting")
    assert page.input_value("#text").startswith("Hello! This page")


@pytest.mark.parametrize(("fmt", "rate"), [("wav", "native"), ("mulaw", "8000"), ("pcm", "24000")])
def test_other_formats_and_rates_play_in_full(page: Page, piper_gateway: str, fmt: str, rate: str) -> None:
    """Rates other than the AudioContext's are resampled in the worklet; every format decodes."""
    open_page(page, piper_gateway)
    page.fill("#text", "Hello there. Every format plays.")
    page.check("input[name=mode][value=whole]")
    page.select_option("#format", fmt)
    page.select_option("#sample-rate", rate)
    page.click("#speak-btn")
    page.wait_for_function("() => window.voxgate.sessionsDone >= 1", timeout=WAIT_MS)
    page.wait_for_function("() => window.voxgate.state === 'idle'", timeout=WAIT_MS)
    state = voxgate(page)
    expected_rate = 22050 if rate == "native" else int(rate)
    assert state["ready"]["config"]["sample_rate"] == expected_rate
    assert state["ready"]["config"]["response_format"] == fmt
    audio_s = sum(s["durationMs"] for s in state["segments"]) / 1000
    assert state["secondsPlayed"] == pytest.approx(audio_s, abs=0.05)
    assert 0.5 < state["peak"] < 1.0  # speech normalised to 0.9, not noise from a wrong decoding
    assert f"played at {state['contextRate']} Hz" in page.inner_text("#session-info")
    assert state["decoder"] is None
    # Uncompressed formats cost what their samples do: 16-bit PCM is rate * 16 bit/s to the byte.
    bits_per_sample = {"wav": 16, "mulaw": 8, "pcm": 16}[fmt]
    assert state["pcmKbps"] == expected_rate * 16 / 1000
    assert state["bitrateKbps"] == pytest.approx(expected_rate * bits_per_sample / 1000, rel=0.01)
    if fmt == "pcm":
        assert page.inner_text("#bandwidth") == "PCM 384 kbit/s (16-bit at 24000 Hz)"


# The encoder's rates (protocol/encoders.py): the page asks for the next one up from the device's.
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)


@pytest.mark.parametrize("rate", ["24000", "device"])
def test_opus_is_decoded_live_by_webcodecs(page: Page, piper_gateway: str, rate: str) -> None:
    """Ogg Opus pages are parsed in the page, decoded by AudioDecoder and played through the worklet."""
    open_page(page, piper_gateway)
    page.fill("#text", "Hello there. Opus is decoded in the page as it arrives.")
    page.check("input[name=mode][value=whole]")
    page.select_option("#format", "opus")
    page.select_option("#sample-rate", rate)
    page.click("#speak-btn")
    page.wait_for_function(
        "() => window.voxgate.sessionsDone >= 1 && window.voxgate.state === 'idle'", timeout=WAIT_MS
    )
    state = voxgate(page)
    assert state["errors"] == []
    config = state["ready"]["config"]
    expected_rate = 24000 if rate == "24000" else min(r for r in OPUS_RATES if r >= state["contextRate"])
    assert (config["response_format"], config["sample_rate"]) == ("opus", expected_rate)
    assert re.search(r"Bit rate\s+32 kbit/s", page.inner_text("#session-info"))

    decoder = state["decoder"]
    assert decoder["error"] is None
    assert decoder["streams"] == 1 and decoder["description"] is False
    assert decoder["inputRate"] == expected_rate and decoder["preSkip"] > 0
    assert decoder["packets"] > 50 and decoder["frames"] == decoder["packets"]  # one AudioData per packet
    # Pre-skip and the EOS granule's end trimming leave exactly the utterance's samples, at 48 kHz.
    audio_s = sum(s["durationMs"] for s in state["segments"]) / 1000
    assert decoder["samples"] / 48000 == pytest.approx(audio_s, abs=0.002)
    assert state["audioSecondsReceived"] == pytest.approx(audio_s, abs=0.002)
    # Every decoded sample reached the worklet and was played.
    assert state["secondsPlayed"] == pytest.approx(audio_s, abs=0.05)
    assert 0.5 < state["peak"] < 1.05  # speech normalised to 0.9 (a lossy codec may overshoot it a little)

    pcm_kbps = expected_rate * 16 / 1000
    assert state["pcmKbps"] == pcm_kbps
    assert 0 < state["bitrateKbps"] < pcm_kbps / 8
    shown = re.fullmatch(
        r"Opus (\d+) kbit/s — ([\d.]+)× less than PCM \((\d+) kbit/s\)", page.inner_text("#bandwidth")
    )
    assert shown, page.inner_text("#bandwidth")
    assert int(shown[3]) == pcm_kbps and float(shown[2]) > 8
    assert int(shown[1]) == round(state["bitrateKbps"])
    assert page.inner_text("#stat-bitrate") == f"{shown[1]} kbit/s"


CHAINED_OPUS_JS = """async ([b64, step]) => {
  const { OggOpusDecoder } = await import("./opus.js");
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const out = { samples: 0, rates: [], errors: [] };
  const decoder = new OggOpusDecoder({
    output: (samples, rate) => { out.samples += samples.length; out.rates.push(rate); },
    error: (err) => out.errors.push(String(err)),
  });
  for (let i = 0; i < bytes.length; i += step) decoder.push(bytes.subarray(i, i + step));
  await decoder.flush();
  return { ...out, rates: [...new Set(out.rates)], stats: decoder.stats };
}"""


def test_ogg_opus_decoder_reads_chained_streams_in_any_pieces(page: Page, piper_gateway: str) -> None:
    """web/opus.js on its own: two Ogg Opus streams back to back (a new BOS resets the decoder), fed in
    pieces that cut pages anywhere, come out trimmed to exactly their input's length at 48 kHz."""
    rate = 24000
    streams = b""
    for serial, seconds in ((1, 0.5), (2, 0.3)):
        t = np.arange(int(seconds * rate)) / rate
        encoder = StreamEncoder("opus", rate, serial=serial)
        streams += encoder.encode((0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)) + encoder.finish()
    open_page(page, piper_gateway)
    for step in (333, len(streams)):
        result = page.evaluate(CHAINED_OPUS_JS, [base64.b64encode(streams).decode(), step])
        assert result["errors"] == [] and result["rates"] == [48000]
        stats = result["stats"]
        assert (stats["streams"], stats["error"], stats["inputRate"]) == (2, None, rate)
        # 20 ms packets of the input and the pre-skip (312 samples at 48 kHz) before it, one AudioData each.
        assert stats["frames"] == stats["packets"] == 26 + 16
        assert result["samples"] == stats["samples"] == stats["receivedSamples"] == (0.5 + 0.3) * 48000


@pytest.mark.parametrize("fmt", ["f32", "opus"])
def test_stop_cancels_mid_paragraph(page: Page, piper_gateway: str, fmt: str) -> None:
    open_page(page, piper_gateway)
    page.select_option("#format", fmt)
    page.fill("#text", LONG_PARAGRAPH)
    set_token_rate(page, 30)
    page.focus("#text")
    page.keyboard.press("Control+Enter")
    page.wait_for_function("() => window.voxgate.secondsPlayed >= 0.5", timeout=WAIT_MS)
    page.click("#stop-btn")
    page.wait_for_function(
        "() => window.voxgate.cancelled >= 1 && window.voxgate.state === 'idle'", timeout=WAIT_MS
    )
    before = voxgate(page)
    page.wait_for_timeout(1000)
    after = voxgate(page)
    assert after["samplesPlayed"] == before["samplesPlayed"]
    assert after["framesReceived"] == before["framesReceived"]
    assert after["framesDropped"] == before["framesDropped"]
    assert after["bufferedMs"] == 0
    # Silence at once, although more audio than that was buffered: measured from the page's own record of
    # the moment Stop ran, not from this process, which a busy machine may delay by any amount.
    at_stop = after["stoppedAt"]
    assert at_stop["bufferedMs"] > 500
    assert after["secondsPlayed"] - at_stop["secondsPlayed"] < 0.3
    assert "cancelled" in page.inner_text("#status")
    # What the listener heard, as audio.cancelled says it: a start of the text sent, in its own characters.
    heard = after["heard"]
    assert heard is not None and heard["playedMs"] > 0 and heard["source"] == "estimate"
    assert LONG_PARAGRAPH.startswith(heard["textSpoken"] + heard["textRemaining"]), heard
    assert "Heard (estimated)" in page.inner_text("#status")
    assert after["errors"] == []
    if fmt == "opus":  # decoded before Stop; what the closed decoder still held was dropped (samplesPlayed)
        assert after["decoder"]["frames"] > 0 and after["decoder"]["error"] is None


@pytest.fixture(scope="module")
def cloning_gateway() -> Iterator[str]:
    """A gateway whose engine clones (the fake one, which speaks uploaded voices as a tone): Piper cannot."""
    with serve_engine(FakeEngine(clones=True)) as address:
        yield address


def test_upload_is_off_with_a_note_on_an_engine_that_cannot_clone(
    page: Page, piper_gateway: str, tmp_path: Path
) -> None:
    voices = f"http://{piper_gateway}/v1/audio/voices"
    assert httpx.get(voices).json()["cloning_engines"] == []
    with write_wav(tmp_path / "kept.wav", 2.0).open("rb") as f:  # stored (a shared folder may have it)
        files = {"audio_sample": ("kept.wav", f, "audio/wav")}
        assert httpx.post(voices, files=files, data={"name": "kept", "consent": "yes"}).status_code == 200
    try:
        open_page(page, piper_gateway)
        option = page.locator("#voice optgroup[label=Uploaded] option")
        assert option.inner_text() == "kept (needs an engine that clones)" and option.is_disabled()
    finally:
        httpx.delete(f"{voices}/kept")
    note = page.locator("#upload-note")
    note.wait_for(state="visible", timeout=WAIT_MS)
    assert note.inner_text() == (
        "This gateway's engine (piper) cannot clone voices, so an uploaded voice could not be spoken here: "
        "uploading is off."
    )
    assert page.eval_on_selector("#upload-fieldset", "el => el.disabled")
    assert all(page.is_disabled(f"#{c}") for c in ("voice-file", "record-btn", "voice-name", "upload-btn"))
    assert page.is_enabled("#speak-btn")  # speaking with the built-in voice is untouched


def test_upload_list_and_delete_a_voice(page: Page, cloning_gateway: str, tmp_path: Path) -> None:
    piper_gateway = cloning_gateway  # the panel is off where no engine clones (the test above)
    open_page(page, piper_gateway)
    assert page.is_hidden("#upload-note") and page.is_enabled("#upload-btn")
    name = "web test voice"

    short = write_wav(tmp_path / "short.wav", 0.5)
    with short.open("rb") as f:
        expected = httpx.post(
            f"http://{piper_gateway}/v1/audio/voices",
            files={"audio_sample": ("short.wav", f, "audio/wav")},
            data={"name": name, "consent": "yes"},
        ).json()["error"]["message"]
    page.set_input_files("#voice-file", short)
    page.fill("#voice-name", name)
    page.check("#voice-consent")
    page.click("#upload-btn")
    page.wait_for_function("() => window.voxgate.lastError !== null", timeout=WAIT_MS)
    assert voxgate(page)["lastError"] == expected
    assert page.inner_text("#error .error-message") == expected

    page.set_input_files("#voice-file", write_wav(tmp_path / "sample.wav", 2.0))
    page.fill("#voice-name", name)
    page.fill("#voice-ref-text", "a hum with some noise")
    page.check("#voice-consent")
    page.click("#upload-btn")
    item = page.locator("#uploaded-list li", has_text=name)
    item.wait_for(timeout=WAIT_MS)
    assert page.locator("#voice optgroup[label=Uploaded] option", has_text=name).count() == 1
    listed = httpx.get(f"http://{piper_gateway}/v1/audio/voices").json()["uploaded_voices"]
    consent = page.inner_text("#consent-text").strip()
    assert [(v["name"], v["consent"], v["ref_text"]) for v in listed] == [
        (name, consent, "a hum with some noise")
    ]

    page.click(f"button[aria-label='Delete voice {name}']")
    item.wait_for(state="detached", timeout=WAIT_MS)
    assert page.locator("#voice optgroup[label=Uploaded]").count() == 0
    assert httpx.get(f"http://{piper_gateway}/v1/audio/voices").json()["uploaded_voices"] == []
    assert "Deleted" in page.inner_text("#status")

    # Recorded from the (fake) microphone: WebM/Opus in the browser, uploaded as WAV.
    page.click("#record-btn")
    page.wait_for_function(
        "() => document.querySelector('#record-btn').getAttribute('aria-pressed') === 'true'"
    )
    page.wait_for_timeout(1500)
    page.click("#record-btn")
    page.locator("#record-preview").wait_for(state="visible", timeout=WAIT_MS)
    page.fill("#voice-name", "microphone")
    page.check("#voice-consent")
    page.click("#upload-btn")
    page.locator("#uploaded-list li", has_text="microphone").wait_for(timeout=WAIT_MS)
    (recorded,) = httpx.get(f"http://{piper_gateway}/v1/audio/voices").json()["uploaded_voices"]
    assert recorded["mime_type"] == "audio/wav" and 1.0 <= recorded["duration_s"] < 5.0
    page.click("button[aria-label='Delete voice microphone']")
    page.locator("#uploaded-list li").first.wait_for(state="detached", timeout=WAIT_MS)


def test_wrong_api_key_shows_the_server_message(page: Page) -> None:
    with serve_engine(None, engine="piper", api_keys=("k1",)) as address:
        expected = httpx.get(
            f"http://{address}/v1/audio/voices", headers={"Authorization": "Bearer wrong"}
        ).json()["error"]["message"]
        page.goto(f"http://{address}/")
        page.wait_for_function("() => window.voxgate.errors.length === 1", timeout=WAIT_MS)  # no key: 401
        page.fill("#api-key", "wrong")
        page.press("#api-key", "Enter")  # applies the key and lists the voices again: 401 again
        page.wait_for_function("() => window.voxgate.errors.length === 2", timeout=WAIT_MS)
        page.fill("#text", "Hello.")
        page.click("#speak-btn")  # the WebSocket is refused; the page asks a REST route why
        page.wait_for_function(
            "() => window.voxgate.errors.length === 3 && window.voxgate.state === 'idle'", timeout=WAIT_MS
        )
        state = voxgate(page)
        assert state["lastError"] == expected
        assert page.inner_text("#error .error-message") == expected
        assert state["state"] == "idle" and state["framesReceived"] == 0

        # The right key (stored in localStorage) opens the WebSocket through the subprotocol.
        page.fill("#api-key", "k1")
        page.press("#api-key", "Enter")
        page.wait_for_function("() => localStorage.getItem('voxgate.apiKey') === 'k1'")
        page.reload()
        assert page.input_value("#api-key") == "k1"
        page.wait_for_function(
            "() => document.querySelectorAll('#voice optgroup option').length > 0", timeout=WAIT_MS
        )
        page.check("input[name=mode][value=whole]")
        page.click("#speak-btn")
        page.wait_for_function("() => window.voxgate.sessionsDone >= 1", timeout=WAIT_MS)
        assert voxgate(page)["framesReceived"] > 0
        page.close()  # closes the WebSocket before this gateway shuts down
