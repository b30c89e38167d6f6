"""REST bodies as codecs: each shape's bytes, golden, without an event loop (protocol/codecs/bodies.py)."""

from __future__ import annotations

import base64
import io
import json
import wave

import msgspec
import numpy as np
import soundfile
from voxgate.protocol.codecs.bodies import (
    MAX_WORDS_HEADER_CHARS,
    SLICE_BYTES,
    BatchBody,
    Body,
    ElevenAudio,
    ElevenLines,
    ElevenWhole,
    HeldAudio,
    ItemResult,
    SseBody,
    Usage,
    output_tokens,
    sized,
    words_headers,
)
from voxgate.protocol.codecs.elevenlabs import Params, Stream, parse_params
from voxgate.protocol.encoders import StreamEncoder
from voxgate.protocol.errors import ErrorCode, ProtocolError
from voxgate.protocol.messages import AudioDone, AudioStart, SessionDone, WordTimestamp, WordTimestamps

DONE = SessionDone(audio_ms=1000.0)
FAILED = ProtocolError(ErrorCode.ENGINE_ERROR, "boom")


def test_the_audio_body_is_its_audio_and_nothing_else() -> None:
    body = Body("audio/pcm")
    out = [body.head(), body.audio(b"ab", 0.1), body.message(AudioDone()), body.audio(b"cd", 0.1)]
    assert (b"".join(out), body.end(DONE), body.error(FAILED), body.headers()) == (b"abcd", b"", b"", {})
    assert (body.held, body.media_type) == (False, "audio/pcm")


def test_sse_is_openais_deltas_then_done_with_usage_or_an_error_event() -> None:
    body = SseBody(characters=5)
    assert body.media_type == "text/event-stream"
    assert body.audio(b"\x00\x01", 0.1) == b'data: {"type":"speech.audio.delta","audio":"AAE="}\n\n'
    assert body.end(DONE) == (
        b'data: {"type":"speech.audio.done",'
        b'"usage":{"input_tokens":5,"output_tokens":12,"total_tokens":17}}\n\n'
    )
    assert json.loads(body.error(FAILED)[6:]) == {
        "type": "speech.audio.error",
        "error": {"message": "boom", "code": "engine_error"},
    }
    assert output_tokens(80.0) == 1


def test_a_held_wav_gets_its_true_sizes_and_readers_take_it_whole() -> None:
    rate = 16000
    body = HeldAudio("audio/wav", "wav", rate, words=True)
    streamed_head = bytes.fromhex("52494646ffffffff57415645") + bytes(32)  # RIFF with "unknown" sizes
    pcm = np.arange(800, dtype=np.int16).tobytes()
    assert body.audio(streamed_head + pcm[:800], 0.025) == b""
    assert body.audio(pcm[800:], 0.025) == b""
    words = WordTimestamps(timestamps=[WordTimestamp(word="Hi", start_ms=0.4, end_ms=49.6)])
    assert body.message(words) == body.message(AudioDone()) == b""
    data = body.end(DONE)
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnframes(), w.getframerate()) == (800, rate)
    assert body.done == DONE and body.held
    assert body.headers() == {"x-word-timestamps": '[{"word": "Hi", "start_ms": 0, "end_ms": 50}]'}
    assert HeldAudio("audio/wav", "wav", rate).headers() == {}  # no header unless word timings were asked


def test_a_held_flac_gets_its_sample_count_and_soundfile_reads_it() -> None:
    rate = 16000
    samples = (0.3 * np.sin(np.arange(4000) / 10.0)).astype(np.float32)
    encoder = StreamEncoder("flac", rate)
    data = encoder.encode(samples) + encoder.finish()
    body = HeldAudio("audio/flac", "flac", rate)
    body.audio(data, len(samples) / rate)
    whole = body.end(DONE)
    decoded, got_rate = soundfile.read(io.BytesIO(whole), dtype="float32")
    assert got_rate == rate and len(decoded) == len(samples)
    assert (
        sized(data, "flac", rate, 1 << 33)[21] & 0x0F == 2
    )  # the count's top bits go in byte 21's low nibble


def test_sized_leaves_other_formats_and_short_files_as_they_are() -> None:
    held = HeldAudio("audio/pcm", "pcm", 24000)
    held.audio(b"ab", 0.0)
    held.audio(b"cd", 0.0)
    assert held.end(DONE) == b"abcd"  # pieces too short to hold a head are joined first
    assert HeldAudio("audio/pcm", "pcm", 24000).parts(DONE) == []  # no audio at all
    assert sized(b"ID3abc", "mp3", 24000, 10) == b"ID3abc"
    assert sized(b"RIFF", "wav", 24000, 10) == b"RIFF"
    assert sized(b"fLaC", "flac", 24000, 10) == b"fLaC"


def test_the_words_header_is_replaced_by_its_marker_past_its_budget() -> None:
    many = [{"word": "x" * 10, "start_ms": 0, "end_ms": 1}] * (MAX_WORDS_HEADER_CHARS // 20)
    (name, value), *_ = words_headers(many).items()
    assert name == "x-word-timestamps-omitted" and value.startswith("oversize; bytes=")


def _segment(stream_body: ElevenAudio | ElevenLines | ElevenWhole, text: str, audio: bytes) -> bytes:
    """One segment through an ElevenLabs body: its audio.start, its audio (held), its audio.done."""
    start = AudioStart(sentence_text=text, format="pcm", sample_rate=16000)
    out = stream_body.message(start) + stream_body.audio(audio, len(audio) / 32000)
    return out + stream_body.message(AudioDone(total_bytes=len(audio), duration_ms=len(audio) / 32.0))


def _stream() -> Stream:
    return Stream("v", parse_params({"output_format": "pcm_16000"}), multi=False)


def test_elevenlabs_audio_is_each_segment_whole_as_its_audio_done_comes() -> None:
    body = ElevenAudio("audio/pcm", _stream())
    assert _segment(body, "Hi. ", b"\x01\x02" * 8) == b"\x01\x02" * 8
    assert body.end(DONE) == b""


def test_elevenlabs_lines_are_one_json_line_a_segment_timed_from_the_answers_start() -> None:
    body = ElevenLines(_stream())
    first = json.loads(_segment(body, "Hi.", bytes(3200)))  # 100 ms
    second = json.loads(_segment(body, "Yo.", bytes(3200)))
    assert base64.b64decode(first["audio_base64"]) == bytes(3200)
    assert first["alignment"] == first["normalized_alignment"]
    assert first["alignment"]["characters"] == list("Hi. ")  # a segment's text and the space after it
    assert second["alignment"]["character_start_times_seconds"][0] == 0.1


def test_elevenlabs_whole_is_one_json_object_byte_for_byte() -> None:
    body = ElevenWhole(_stream())
    audio = [bytes(range(7)), bytes(range(5))]  # lengths that leave base64 groups open across segments
    data = body.head() + _segment(body, "Hi.", audio[0]) + _segment(body, "Yo.", audio[1]) + body.end(DONE)
    answer = json.loads(data)
    assert base64.b64decode(answer["audio_base64"]) == b"".join(audio)
    assert answer["alignment"] == answer["normalized_alignment"]
    assert answer["alignment"]["characters"] == list("Hi. Yo. ")
    expected = {
        "audio_base64": base64.b64encode(b"".join(audio)).decode(),
        "alignment": answer["alignment"],
        "normalized_alignment": answer["alignment"],
    }
    assert data == json.dumps(expected, ensure_ascii=False, separators=(",", ":")).encode()


def test_the_batch_body_is_vllm_omnis_answer_and_a_success_is_written_in_slices() -> None:
    body = BatchBody("speech-batch-1", 3)
    audio = bytes(range(256)) * (SLICE_BYTES // 256 + 1)  # more than one slice
    usage = Usage.of(5, 1000.0)
    pieces = [body.head(), body.result(ItemResult(index=0, status="error", error="no"))]
    success = list(body.success(1, [audio[:7], audio[7:]], "audio/wav", usage))
    assert len(success) == 4  # the head, a slice of base64 per SLICE_BYTES of audio and the rest, the tail
    pieces += success
    pieces += [body.result(ItemResult(index=2, status="success", audio_data="", media_type="audio/pcm"))]
    answer = json.loads(b"".join(pieces) + body.end())
    assert answer["id"] == "speech-batch-1"
    assert (answer["total"], answer["succeeded"], answer["failed"]) == (3, 2, 1)
    first, second, _ = answer["results"]
    assert first == {"index": 0, "status": "error", "error": "no"}
    assert base64.b64decode(second["audio_data"]) == audio
    written = msgspec.json.encode(
        ItemResult(
            index=1,
            status="success",
            audio_data=base64.b64encode(audio).decode(),
            media_type="audio/wav",
            usage=usage,
        )
    )
    assert b"".join(success)[1:] == written  # the same bytes as one encode of the whole result
    assert usage.output_tokens == 12 and usage.input_token_details.text_tokens == 5


def test_params_default_is_the_rest_shape() -> None:
    assert isinstance(parse_params({}), Params)
