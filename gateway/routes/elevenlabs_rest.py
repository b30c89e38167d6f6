"""ElevenLabs-compatible REST: ``POST /v1/text-to-speech/{voice_id}`` (and ``/stream``, ``/with-timestamps``,
``/stream/with-timestamps``), and ``GET /v1/voices``.

Each request's session is built on the one session host (``gateway.session.host``, as OpenAI's route's is: the
same limits, core and engine pump as every socket): its text is one utterance, and the route's body codec
(``protocol.codecs.bodies``: ``ElevenAudio``, ``ElevenLines``, ``ElevenWhole``) turns each of its segments
into the
segment's whole audio with its alignment (``protocol.codecs.elevenlabs.Stream``), in any of ElevenLabs'
formats
(``mp3_*`` and ``opus_48000_*`` one complete file per segment, sent as it is made).

Every route writes its body as it is made (``gateway.transport.body``), so a request holds at most a
segment's audio
and what the pump keeps ahead (``max_buffered_audio_s``), whatever its length: the plain routes write each
segment's audio, ``/stream/with-timestamps`` a JSON line per segment, and ``/with-timestamps`` its one JSON
object in pieces: the audio's base64 as each segment comes, then the alignment, the only part kept to the
end (a few numbers a character).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...protocol.codecs.bodies import Body, ElevenAudio, ElevenLines, ElevenWhole
from ...protocol.codecs.elevenlabs import Stream, decode_body, http_error, parse_params, session_config
from ...protocol.codecs.openai import speakable
from ...protocol.encoders import MEDIA_TYPES as COMPRESSED_MEDIA_TYPES
from ...protocol.errors import ErrorCode, ProtocolError
from ...protocol.output import OutputFormat
from ..middleware.http import BodyTooLarge, read_body
from ..session.failures import REFUSALS, error_for
from ..session.host import SessionHost, ignored_headers
from ..transport.body import respond
from ..voices.catalog import Catalog
from .elevenlabs_dictionaries import located
from .elevenlabs_ws import DIALECT, times_words

logger = logging.getLogger(__name__)

#: A REST body holds text (ElevenLabs allows 5,000 to 40,000 characters by model) and a few options.
MAX_BODY_BYTES = 1024 * 1024
#: The ``Content-Type`` of each format's body (a compressed format's: one complete file per segment).
MEDIA_TYPES = {"pcm": "audio/pcm", "mulaw": "audio/basic", **COMPRESSED_MEDIA_TYPES}


def _refused(err: ProtocolError) -> Response:
    return Response(http_error(err), status_code=err.status, media_type="application/json")


#: Makes a route's body codec from the answer's segments and its format's media type.
_Shape = Callable[[Stream, str], Body]


async def _speak(request: Request, shape: _Shape) -> Response:
    """Answer one request in the body ``shape`` makes."""
    voice_id = request.path_params["voice_id"]
    state = request.state
    try:
        params = parse_params(request.query_params)
        body = decode_body(await read_body(request, MAX_BODY_BYTES))
        if not speakable(body.text):
            raise ProtocolError(ErrorCode.EMPTY_INPUT, "text has nothing to speak", field="text")
        params = dataclasses.replace(params, model_id=body.model_id or params.model_id, seed=body.seed)
        owner = getattr(state, "owner", "")
        said = await located(state, owner, body.pronunciation_dictionary_locators)
        normalization = body.apply_text_normalization
        settings = body.voice_settings
        config = session_config(
            voice_id, params, settings, text_normalization=normalization, pronunciations=said
        )
        # The voice is resolved once; whether its engine times words is asked of the engine after.
        resolved = await state.catalog.prepare(
            owner, config.voice_name, config.model, config.engine_options()
        )
        words = times_words(resolved)
        if words:
            config = msgspec.structs.replace(config, word_timestamps=True)
            resolved = dataclasses.replace(resolved, options={**resolved.options, "word_timestamps": True})
        rate = config.output_rate(resolved.engine.sample_rate)
        fmt = OutputFormat.of(config, rate).check()
        meter = state.metrics.session(DIALECT)
        meter.configured(resolved.engine.name)
        host = SessionHost(state.settings, meter)
        await host.speak(config, fmt, body.text, resolved)
    except BodyTooLarge as exc:
        return _refused(ProtocolError(ErrorCode.REQUEST_TOO_LARGE, str(exc)))
    except REFUSALS as exc:
        return _refused(error_for(exc))
    except ProtocolError as err:
        return _refused(err)
    segments = Stream(voice_id, params, multi=False, words=words)
    answer = shape(segments, MEDIA_TYPES[fmt.fmt])
    headers = {"x-sample-rate": str(rate), **ignored_headers(resolved)}
    return await respond(host, answer, _refused, headers)


async def convert(request: Request) -> Response:
    """``POST /v1/text-to-speech/{voice_id}`` and ``.../stream``: the audio, streamed as it is made."""
    return await _speak(request, lambda segments, media_type: ElevenAudio(media_type, segments))


async def stream_with_timestamps(request: Request) -> Response:
    """``POST /v1/text-to-speech/{voice_id}/stream/with-timestamps``: NDJSON audio with alignment."""
    return await _speak(request, lambda segments, _: ElevenLines(segments))


async def convert_with_timestamps(request: Request) -> Response:
    """``POST /v1/text-to-speech/{voice_id}/with-timestamps``: one JSON object, written as it is made."""
    return await _speak(request, lambda segments, _: ElevenWhole(segments))


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
