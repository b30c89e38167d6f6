"""ElevenLabs-compatible REST: ``POST /v1/text-to-speech/{voice_id}`` (and ``/stream``, ``/with-timestamps``,
``/stream/with-timestamps``), and ``GET /v1/voices``.

Each request is one voxgate session behind a pipe, as each WebSocket context is (``gateway.elevenlabs``):
its text is one utterance, and each of its segments comes out whole with its alignment, in any of
ElevenLabs' formats (``mp3_*`` and ``opus_48000_*`` one complete file per segment, sent as it is made).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..protocol.elevenlabs import (
    Alignment,
    Inbound,
    Params,
    Stream,
    decode_inbound,
    http_error,
    parse_params,
    seconds_alignment,
)
from ..protocol.encoders import MEDIA_TYPES as COMPRESSED_MEDIA_TYPES
from ..protocol.errors import ErrorCode, ProtocolError, field_path
from ..protocol.messages import Error
from .catalog import Catalog
from .elevenlabs import Pipe, check_voice, connection_for, run_session
from .http import BodyTooLarge, read_body

logger = logging.getLogger(__name__)

#: A REST body holds text (ElevenLabs allows 5,000 to 40,000 characters by model) and a few options.
MAX_BODY_BYTES = 1024 * 1024
#: Segments the REST producer may run ahead of a slow reader.
AHEAD_SEGMENTS = 4
_encode = msgspec.json.Encoder().encode
#: The ``Content-Type`` of each format's body (a compressed format's: one complete file per segment).
MEDIA_TYPES = {"pcm": "audio/pcm", "mulaw": "audio/basic", **COMPRESSED_MEDIA_TYPES}


class _Body(msgspec.Struct, frozen=True, kw_only=True):
    """The body of ``POST /v1/text-to-speech/{voice_id}``; the fields not named here are ignored."""

    text: str
    model_id: str | None = None
    seed: int | None = None
    voice_settings: dict[str, object] | None = None


#: What the REST producer hands the response: a segment, the failure that ended it, None at the end.
_Item = tuple[bytes, Alignment, float] | ProtocolError | None


def _refused(err: ProtocolError) -> Response:
    return Response(http_error(err), status_code=err.status, media_type="application/json")


async def _speak(request: Request, timestamps: bool) -> Response:
    voice_id = request.path_params["voice_id"]
    state = request.state
    try:
        params = parse_params(request.query_params)
        body = msgspec.json.decode(await read_body(request, MAX_BODY_BYTES), type=_Body)
        if not body.text.strip():
            raise ProtocolError(ErrorCode.EMPTY_INPUT, "text has nothing to speak", field="text")
        params = Params(
            params.output_format, body.model_id or params.model_id, body.seed, params.inactivity_timeout_s
        )
        words = await check_voice(state, voice_id, params)
        first = decode_inbound(_encode({"text": body.text, "voice_settings": body.voice_settings}))
    except BodyTooLarge as exc:
        return _refused(ProtocolError(ErrorCode.REQUEST_TOO_LARGE, str(exc)))
    except msgspec.ValidationError as exc:
        return _refused(ProtocolError(ErrorCode.INVALID_MESSAGE, str(exc), field=field_path(exc)))
    except msgspec.DecodeError as exc:
        return _refused(ProtocolError(ErrorCode.INVALID_JSON, f"invalid JSON body: {exc}"))
    except ProtocolError as err:
        return _refused(err)

    codec = Stream(voice_id, params, multi=False, words=words)
    queue: asyncio.Queue[_Item] = asyncio.Queue(maxsize=AHEAD_SEGMENTS)
    fmt, rate = params.audio

    async def sink(data: str | bytes) -> None:
        if isinstance(data, bytes):
            codec.hold(data)  # its audio.done comes next, with its length
        elif (error := codec.observe(data)) is not None:
            await queue.put(_failure(error))
        elif (segment := codec.take_segment()) is not None:
            await queue.put(segment)

    pipe = Pipe(sink)
    try:
        for out in codec.receive(first) + codec.receive(Inbound(text="")):
            pipe.push(out)
    except ProtocolError as err:
        return _refused(err)

    async def produce() -> None:
        await run_session(connection_for(state, pipe, params, context_idle_timeout_s=0.0), pipe)
        await queue.put(None)

    producer = asyncio.create_task(produce())
    head = await queue.get()
    if isinstance(head, ProtocolError):
        producer.cancel()
        return _refused(head)
    headers = {"x-sample-rate": str(rate)}
    if not timestamps:
        media = MEDIA_TYPES[fmt]
        return StreamingResponse(_audio(head, queue, producer), media_type=media, headers=headers)
    return StreamingResponse(
        _timestamps(head, queue, producer), media_type="application/json", headers=headers
    )


def _failure(error: Error) -> ProtocolError:
    """A session's error as a failure of the request (a code outside the error table: internal)."""
    try:
        code = ErrorCode(error.code)
    except ValueError:
        code = ErrorCode.INTERNAL_ERROR
    return ProtocolError(code, error.message)


async def _items(
    head: _Item, queue: asyncio.Queue[_Item], producer: asyncio.Task[None]
) -> AsyncIterator[_Item]:
    try:
        item = head
        while item is not None:
            yield item
            if isinstance(item, ProtocolError):
                return
            item = await queue.get()
    finally:
        producer.cancel()  # a client that goes away stops the engine work too
        await asyncio.wait([producer])


async def _audio(
    head: _Item, queue: asyncio.Queue[_Item], producer: asyncio.Task[None]
) -> AsyncIterator[bytes]:
    async for item in _items(head, queue, producer):
        if isinstance(item, ProtocolError):
            logger.warning("engine failed mid-stream; response truncated: %s", item.message)
            return
        assert item is not None
        yield item[0]


async def _timestamps(
    head: _Item, queue: asyncio.Queue[_Item], producer: asyncio.Task[None]
) -> AsyncIterator[bytes]:
    """NDJSON, one line a segment: ``audio_base64``, ``alignment`` and ``normalized_alignment`` (seconds)."""
    offset_ms = 0.0
    async for item in _items(head, queue, producer):
        if isinstance(item, ProtocolError):
            logger.warning("engine failed mid-stream; response truncated: %s", item.message)
            return
        assert item is not None
        audio, alignment, duration_ms = item
        shape = msgspec.to_builtins(seconds_alignment(alignment, offset_ms))
        line = {
            "audio_base64": base64.b64encode(audio).decode(),
            "alignment": shape,
            "normalized_alignment": shape,
        }
        offset_ms += duration_ms
        yield _encode(line) + b"\n"


async def convert(request: Request) -> Response:
    """``POST /v1/text-to-speech/{voice_id}`` and ``.../stream``: the audio, streamed as it is made."""
    return await _speak(request, timestamps=False)


async def stream_with_timestamps(request: Request) -> Response:
    """``POST /v1/text-to-speech/{voice_id}/stream/with-timestamps``: NDJSON audio with alignment."""
    return await _speak(request, timestamps=True)


async def convert_with_timestamps(request: Request) -> Response:
    """``POST /v1/text-to-speech/{voice_id}/with-timestamps``: one JSON object, its alignment whole."""
    response = await _speak(request, timestamps=True)
    if not isinstance(response, StreamingResponse):
        return response
    audio, chars, starts, ends = bytearray(), [], [], []
    async for line in response.body_iterator:
        part = json.loads(bytes(line) if not isinstance(line, str) else line)
        audio += base64.b64decode(part["audio_base64"])
        chars += part["alignment"]["characters"]
        starts += part["alignment"]["character_start_times_seconds"]
        ends += part["alignment"]["character_end_times_seconds"]
    shape = {
        "characters": chars,
        "character_start_times_seconds": starts,
        "character_end_times_seconds": ends,
    }
    return JSONResponse(
        {
            "audio_base64": base64.b64encode(bytes(audio)).decode(),
            "alignment": shape,
            "normalized_alignment": shape,
        }
    )


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
