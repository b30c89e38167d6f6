"""ElevenLabs-compatible REST: ``POST /v1/text-to-speech/{voice_id}`` (and ``/stream``, ``/with-timestamps``,
``/stream/with-timestamps``), and ``GET /v1/voices``.

Each request runs on the REST producer (``gateway.rest``, as OpenAI's route does): its text is one
utterance, and ``protocol.elevenlabs.Stream`` turns each of its segments into the segment's whole audio
with its alignment, in any of ElevenLabs' formats (``mp3_*`` and ``opus_48000_*`` one complete file per
segment, sent as it is made).

Every route writes its body as it is made (chunked), so a request holds at most a segment's audio and
what the pump keeps ahead (``max_buffered_audio_s``), whatever its length: the plain routes write each
segment's audio, ``/stream/with-timestamps`` a JSON line per segment, and ``/with-timestamps`` its one
JSON object in pieces (``WholeBody``): the audio's base64 as each segment comes, then the alignment, the
only part kept to the end (a few numbers a character).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator, Callable

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..protocol.alignment import Alignment, seconds_alignment
from ..protocol.elevenlabs import (
    Params,
    Stream,
    decode_body,
    http_error,
    parse_params,
    session_config,
)
from ..protocol.encoders import MEDIA_TYPES as COMPRESSED_MEDIA_TYPES
from ..protocol.errors import ErrorCode, ProtocolError
from ..protocol.output import Audio, Message, OutputFormat
from .catalog import Catalog
from .elevenlabs import DIALECT, check_voice
from .failures import REFUSALS, error_for
from .http import BodyTooLarge, read_body
from .rest import Producer, pieces, start

logger = logging.getLogger(__name__)

#: A REST body holds text (ElevenLabs allows 5,000 to 40,000 characters by model) and a few options.
MAX_BODY_BYTES = 1024 * 1024
_encode = msgspec.json.Encoder().encode
#: The ``Content-Type`` of each format's body (a compressed format's: one complete file per segment).
MEDIA_TYPES = {"pcm": "audio/pcm", "mulaw": "audio/basic", **COMPRESSED_MEDIA_TYPES}


#: What the response gets: a segment (its audio, alignment and length in ms), or the failure that ends it.
_Item = tuple[bytes, Alignment, float] | ProtocolError


def _refused(err: ProtocolError) -> Response:
    return Response(http_error(err), status_code=err.status, media_type="application/json")


#: Renders a response's segments into its body.
_Render = Callable[[Producer, _Item | None, AsyncIterator[_Item]], AsyncIterator[bytes]]


async def _speak(request: Request, render: _Render, media_type: str | None) -> Response:
    """Answer one request: its body rendered by ``render`` (``media_type`` None: the audio format's)."""
    voice_id = request.path_params["voice_id"]
    state = request.state
    try:
        params = parse_params(request.query_params)
        body = decode_body(await read_body(request, MAX_BODY_BYTES))
        if not body.text.strip():
            raise ProtocolError(ErrorCode.EMPTY_INPUT, "text has nothing to speak", field="text")
        params = Params(
            params.output_format, body.model_id or params.model_id, body.seed, params.inactivity_timeout_s
        )
        words = await check_voice(state, voice_id, params)
        config = session_config(voice_id, params, body.voice_settings, words=words)
        resolved = await state.catalog.prepare(
            getattr(state, "owner", ""), config.voice_name, config.model, config.engine_options()
        )
        rate = config.output_rate(resolved.engine.sample_rate)
        fmt = OutputFormat.of(config, rate).check()
    except BodyTooLarge as exc:
        return _refused(ProtocolError(ErrorCode.REQUEST_TOO_LARGE, str(exc)))
    except REFUSALS as exc:
        return _refused(error_for(exc))
    except ProtocolError as err:
        return _refused(err)

    meter = state.metrics.session(DIALECT)
    meter.configured(resolved.engine.name)
    producer = await start(state.settings, config, fmt, body.text, resolved, meter)
    items = _segments(producer, Stream(voice_id, params, multi=False, words=words))
    head = await anext(items, None)
    if isinstance(head, ProtocolError):
        await producer.aclose()
        return _refused(head)
    media = media_type or MEDIA_TYPES[fmt.fmt]
    headers = {"x-sample-rate": str(rate)}
    return StreamingResponse(render(producer, head, items), media_type=media, headers=headers)


async def _segments(producer: Producer, codec: Stream) -> AsyncIterator[_Item]:
    """The response's segments in order, each whole with its alignment, or the failure that ends it."""
    async for piece in pieces(producer):
        match piece:
            case Audio(data=data):
                codec.hold(data)  # its audio.done comes next, with its length
            case Message(msg=msg):
                codec.observe(msg)
                if (segment := codec.take_segment()) is not None:
                    yield segment
            case ProtocolError():
                yield piece


async def _items(
    producer: Producer, head: _Item | None, items: AsyncIterator[_Item]
) -> AsyncIterator[tuple[bytes, Alignment, float]]:
    producer.meter.open()
    try:
        item = head
        while item is not None:
            if isinstance(item, ProtocolError):
                producer.meter.error(item.code)
                logger.warning("engine failed mid-stream; response truncated: %s", item.message)
                return
            yield item
            item = await anext(items, None)
    finally:
        producer.meter.close()
        await producer.aclose()  # a client that goes away stops the engine work too


async def _audio(producer: Producer, head: _Item | None, items: AsyncIterator[_Item]) -> AsyncIterator[bytes]:
    async for audio, _, _ in _items(producer, head, items):
        producer.meter.wrote(audio)
        yield audio


async def _lines(producer: Producer, head: _Item | None, items: AsyncIterator[_Item]) -> AsyncIterator[bytes]:
    """NDJSON, one line a segment: ``audio_base64``, ``alignment`` and ``normalized_alignment`` (seconds)."""
    offset_ms = 0.0
    async for audio, alignment, duration_ms in _items(producer, head, items):
        shape = msgspec.to_builtins(seconds_alignment(alignment, offset_ms))
        line = {
            "audio_base64": base64.b64encode(audio).decode(),
            "alignment": shape,
            "normalized_alignment": shape,
        }
        offset_ms += duration_ms
        payload = _encode(line) + b"\n"
        producer.meter.wrote(payload)
        yield payload


class WholeBody:
    """The ``with-timestamps`` JSON object, written in pieces as its segments come.

    ``{"audio_base64":"<base64 of every segment's audio>","alignment":A,"normalized_alignment":A}``,
    byte for byte what one ``json.dumps`` of the whole answer gives (Starlette's ``JSONResponse``, which
    this route used when it held the answer whole): the base64 of the audio so far, up to its last whole
    3-byte group (a base64 of 3-byte pieces is the base64 of their sum), goes out with each segment; the
    up to 2 bytes left wait for the next. Only the alignment is kept to the end.
    """

    def __init__(self) -> None:
        self._left = b""  # the audio's last bytes that do not fill a 3-byte group yet
        self._offset_ms = 0.0  # where the next segment starts in the answer's audio
        self._chars: list[str] = []
        self._starts: list[float] = []
        self._ends: list[float] = []

    def head(self) -> bytes:
        """The object's opening, up to the audio's base64."""
        return b'{"audio_base64":"'

    def segment(self, audio: bytes, alignment: Alignment, duration_ms: float) -> bytes:
        """The base64 a segment completes; its alignment is kept for ``tail``."""
        shape = seconds_alignment(alignment, self._offset_ms)
        self._offset_ms += duration_ms
        self._chars += shape.characters
        self._starts += shape.character_start_times_seconds
        self._ends += shape.character_end_times_seconds
        data = self._left + audio if self._left else audio
        whole = len(data) - len(data) % 3
        self._left = data[whole:]
        return base64.b64encode(memoryview(data)[:whole])

    def tail(self) -> bytes:
        """The rest of the base64, then the alignment (twice, as ElevenLabs sends it)."""
        shape = {
            "characters": self._chars,
            "character_start_times_seconds": self._starts,
            "character_end_times_seconds": self._ends,
        }
        alignment = json.dumps(shape, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        rest = base64.b64encode(self._left).decode()
        return f'{rest}","alignment":{alignment},"normalized_alignment":{alignment}}}'.encode()


async def _whole(producer: Producer, head: _Item | None, items: AsyncIterator[_Item]) -> AsyncIterator[bytes]:
    """One JSON object (``WholeBody``), written as the segments come."""
    body = WholeBody()
    yield body.head()
    async for audio, alignment, duration_ms in _items(producer, head, items):
        payload = body.segment(audio, alignment, duration_ms)
        producer.meter.wrote(payload)
        yield payload
    yield body.tail()


async def convert(request: Request) -> Response:
    """``POST /v1/text-to-speech/{voice_id}`` and ``.../stream``: the audio, streamed as it is made."""
    return await _speak(request, _audio, None)


async def stream_with_timestamps(request: Request) -> Response:
    """``POST /v1/text-to-speech/{voice_id}/stream/with-timestamps``: NDJSON audio with alignment."""
    return await _speak(request, _lines, "application/json")


async def convert_with_timestamps(request: Request) -> Response:
    """``POST /v1/text-to-speech/{voice_id}/with-timestamps``: one JSON object, written as it is made."""
    return await _speak(request, _whole, "application/json")


async def list_voices(request: Request) -> JSONResponse:
    """``GET /v1/voices``: our built-in voices in ElevenLabs' shape (the id is the voice's name)."""
    catalog: Catalog = request.state.catalog
    names = dict.fromkeys(v.name for v in await catalog.builtin_voices())
    voices: list[dict[str, object]] = [
        {"voice_id": name, "name": name, "category": "premade", "labels": {}, "description": None}
        for name in names
    ]
    return JSONResponse({"voices": voices, "has_more": False, "total_count": len(voices)})


routes = [
    Route("/v1/text-to-speech/{voice_id}", convert, methods=["POST"]),
    Route("/v1/text-to-speech/{voice_id}/stream", convert, methods=["POST"]),
    Route("/v1/text-to-speech/{voice_id}/with-timestamps", convert_with_timestamps, methods=["POST"]),
    Route("/v1/text-to-speech/{voice_id}/stream/with-timestamps", stream_with_timestamps, methods=["POST"]),
    Route("/v1/voices", list_voices),
]
