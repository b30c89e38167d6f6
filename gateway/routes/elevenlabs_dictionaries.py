"""ElevenLabs' pronunciation dictionary routes, per API key (the ``elevenlabs`` SDK's
``client.pronunciation_dictionaries``):

- ``POST /v1/pronunciation-dictionaries/add-from-file``: multipart ``name``, ``file`` (a PLS lexicon,
  ``protocol.pls``), optional ``description`` (``workspace_access`` is accepted and ignored): a new
  dictionary, answered as ElevenLabs' ``AddPronunciationDictionaryResponseModel``.
- ``POST /v1/pronunciation-dictionaries/add-from-rules``: ``{"name", "rules", "description"?}``, ElevenLabs'
  alias and phoneme rules (``word_boundaries: false`` is refused: voxgate matches whole words).
- ``GET /v1/pronunciation-dictionaries/{id}/{version_id}/download``: the dictionary as a PLS lexicon.
- ``POST /v1/pronunciation-dictionaries/{id}/set-rules``, ``.../add-rules`` (``{"rules"}``) and
  ``.../remove-rules`` (``{"rule_strings"}``): a new version of its rules (only the latest is kept).
- ``GET /v1/pronunciation-dictionaries``: the key's dictionaries (``page_size``, ``cursor``, ``sort``,
  ``sort_direction``, ``include_archived``), as ElevenLabs pages them.
- ``GET /v1/pronunciation-dictionaries/{id}``: one, with its rules.
- ``PATCH /v1/pronunciation-dictionaries/{id}``: ``{"name"?, "archived"?}``, ElevenLabs' way to retire a
  dictionary (archived ones are not listed by default and are refused by locators).
- ``DELETE /v1/pronunciation-dictionaries/{id}``: voxgate's own (ElevenLabs archives instead): removes it
  and frees its place under the key's caps.

Dictionaries live beside the voices (``gateway.voices.dictionaries``). Every refusal is in ElevenLabs' error
shape, ``{"detail": {"status": code, "message": ...}}``, with the HTTP status of the code
(``protocol.errors.FAILURES``): a bad file is a 400 ``invalid_lexicon``, an unknown id a 404.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

import msgspec
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...protocol import pls
from ...protocol.codecs.elevenlabs import http_error
from ...protocol.dictionaries import (
    MAX_DESCRIPTION_CHARS,
    MAX_NAME_CHARS,
    Dictionary,
    Locator,
    added,
    decode_new_rules,
    decode_rule_strings,
    decode_rules,
    entries,
    listing,
    metadata,
    new_id,
    new_version,
    not_found,
    parse_page,
    pronunciations,
    version,
    with_added,
    with_rules,
    without,
)
from ...protocol.errors import ErrorCode, ProtocolError, decoded
from ...protocol.messages import Pronunciation
from ..middleware.http import BodyTooLarge, Rejected, read_body
from ..voices.dictionaries import DictionaryBackend, DictionaryLimitReached, DictionaryQuotaExceeded
from ..voices.local import VoiceStoreUnavailable
from .multipart import FormLimits, read_form, text_field

logger = logging.getLogger(__name__)

#: The shared store (S3) usually comes back within seconds.
STORE_RETRY_AFTER_S = 5
LIMITS = FormLimits(
    what="pronunciation dictionary upload",
    body_bytes=pls.MAX_LEXICON_BYTES + 64 * 1024,
    parts={"file": pls.MAX_LEXICON_BYTES},
    text_bytes=4 * MAX_DESCRIPTION_CHARS,
    urlencoded_bytes=64 * 1024,
    fields=8,
)
#: A PATCH body: a name and a flag.
MAX_PATCH_BYTES = 16 * 1024
#: An ``add-from-rules`` body: 256 rules of a few hundred bytes each, a name and a description.
MAX_RULES_BYTES = 256 * 1024


class _Patch(msgspec.Struct, frozen=True, kw_only=True):
    """``PATCH``'s body: ElevenLabs' ``name`` and ``archived``; other fields are ignored."""

    name: str | None = None
    archived: bool | None = None


_decode_patch = msgspec.json.Decoder(_Patch).decode


def _refused(err: ProtocolError, status: int | None = None) -> Response:
    response = Response(http_error(err), status_code=status or err.status, media_type="application/json")
    if err.code == ErrorCode.VOICE_STORE_UNAVAILABLE:
        response.headers["Retry-After"] = str(STORE_RETRY_AFTER_S)
    return response


def _store_error(exc: Exception) -> Response:
    """The refusal of a store failure: a cap (409), or a shared store that did not answer (503)."""
    match exc:
        case DictionaryLimitReached():
            return _refused(ProtocolError(ErrorCode.PRONUNCIATION_DICTIONARY_LIMIT_REACHED, str(exc)))
        case DictionaryQuotaExceeded():
            return _refused(ProtocolError(ErrorCode.PRONUNCIATION_DICTIONARY_QUOTA_EXCEEDED, str(exc)))
    logger.error("%s", exc)
    message = "the voice store is unavailable; try again shortly"
    return _refused(ProtocolError(ErrorCode.VOICE_STORE_UNAVAILABLE, message))


def _store(request: Request) -> DictionaryBackend:
    store: DictionaryBackend = request.state.dictionaries
    return store


async def located(
    state: object, owner: str, locators: Sequence[Locator] | None
) -> list[Pronunciation] | None:
    """The entries of the dictionaries a speech request's ``pronunciation_dictionary_locators`` name (each
    read from the store once).

    Raises:
        ProtocolError: as ``protocol.dictionaries.pronunciations``.
    """
    if not locators:
        return None
    store: DictionaryBackend = state.dictionaries  # type: ignore[attr-defined]
    found: dict[str, Dictionary] = {}
    try:
        for dictionary_id in dict.fromkeys(locator.pronunciation_dictionary_id for locator in locators):
            dictionary = await run_in_threadpool(store.get, owner, dictionary_id)
            if dictionary is not None:
                found[dictionary_id] = dictionary
    except VoiceStoreUnavailable as exc:
        logger.error("%s", exc)
        return pronunciations(locators, None)
    return pronunciations(locators, found)


async def owned(state: object, owner: str) -> Mapping[str, Dictionary] | None:
    """Every dictionary of ``owner`` by id, for a socket whose first message may name some (None: the store
    did not answer; a socket that names none is not refused for it)."""
    store: DictionaryBackend = state.dictionaries  # type: ignore[attr-defined]
    try:
        return {d.id: d for d in await run_in_threadpool(store.list, owner)}
    except VoiceStoreUnavailable as exc:
        logger.error("%s", exc)
        return None


def _owner(request: Request) -> str:
    owner: str = getattr(request.state, "owner", "")
    return owner


def _name(value: str | None, field: str) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > MAX_NAME_CHARS:
        message = f"{field} must be 1 to {MAX_NAME_CHARS} characters"
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, message, field=field)
    return value


def _new(
    request: Request, name: str | None, description: str | None, rules: list[Pronunciation]
) -> Dictionary:
    """A new dictionary of the caller's, its name and description checked."""
    name = _name(name, "name")
    if name is None:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, "name is required", field="name")
    if description is not None and len(description) > MAX_DESCRIPTION_CHARS:
        message = f"description is at most {MAX_DESCRIPTION_CHARS} characters"
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, message, field="description")
    return Dictionary(
        id=new_id(),
        owner=_owner(request),
        version_id=new_id(),
        name=name,
        description=description,
        created_at=int(time.time()),
        rules=rules,
    )


async def add_from_file(request: Request) -> Response:
    """``POST /v1/pronunciation-dictionaries/add-from-file``: a new dictionary from a PLS lexicon."""
    try:
        parts = await read_form(request.headers.get("content-type", ""), request.stream(), LIMITS)
        name, description = text_field(parts, "name"), text_field(parts, "description")
        upload = parts.get("file")
        if upload is None:
            raise pls.invalid("no file: send the lexicon as the multipart part 'file'")
        dictionary = _new(request, name, description, pls.parse(bytes(upload.data)))
        await run_in_threadpool(_store(request).add, dictionary)
    except Rejected as exc:
        return _refused(ProtocolError(exc.code, exc.message, field=exc.param))
    except ProtocolError as err:
        return _refused(err)
    except ClientDisconnect:
        return _refused(ProtocolError(ErrorCode.CLIENT_DISCONNECTED, "the request body was cut short"))
    except (DictionaryLimitReached, DictionaryQuotaExceeded, VoiceStoreUnavailable) as exc:
        return _store_error(exc)
    return JSONResponse(added(dictionary))


async def add_from_rules(request: Request) -> Response:
    """``POST /v1/pronunciation-dictionaries/add-from-rules``: a new dictionary from JSON rules."""
    try:
        body = decode_rules(await read_body(request, MAX_RULES_BYTES))
        dictionary = _new(request, body.name, body.description, entries(body.rules))
        await run_in_threadpool(_store(request).add, dictionary)
    except BodyTooLarge as exc:
        return _refused(ProtocolError(ErrorCode.REQUEST_TOO_LARGE, str(exc)))
    except ProtocolError as err:
        return _refused(err)
    except (DictionaryLimitReached, DictionaryQuotaExceeded, VoiceStoreUnavailable) as exc:
        return _store_error(exc)
    return JSONResponse(added(dictionary))


async def download(request: Request) -> Response:
    """``GET /v1/pronunciation-dictionaries/{id}/{version_id}/download``: the version as a PLS lexicon."""
    try:
        dictionary = await _found(request)
        if request.path_params["version_id"] != dictionary.version_id:
            version = request.path_params["version_id"]
            raise not_found(
                f"pronunciation dictionary {dictionary.id!r} has no version {version!r}", "version_id"
            )
    except ProtocolError as err:
        return _refused(err, 404)
    except VoiceStoreUnavailable as exc:
        return _store_error(exc)
    return Response(pls.write(dictionary.rules), media_type="application/pls+xml")


async def list_dictionaries(request: Request) -> Response:
    """``GET /v1/pronunciation-dictionaries``: one page of the key's dictionaries."""
    try:
        page = parse_page(request.query_params)
        found = await run_in_threadpool(_store(request).list, _owner(request))
    except ProtocolError as err:
        return _refused(err)
    except VoiceStoreUnavailable as exc:
        return _store_error(exc)
    return JSONResponse(listing(found, page))


async def _found(request: Request) -> Dictionary:
    dictionary_id = request.path_params["dictionary_id"]
    dictionary = await run_in_threadpool(_store(request).get, _owner(request), dictionary_id)
    if dictionary is None:
        raise not_found(f"no pronunciation dictionary {dictionary_id!r} of this API key", "dictionary_id")
    return dictionary


async def get_dictionary(request: Request) -> Response:
    """``GET /v1/pronunciation-dictionaries/{id}``: its metadata and rules."""
    try:
        dictionary = await _found(request)
    except ProtocolError as err:
        return _refused(err, 404)
    except VoiceStoreUnavailable as exc:
        return _store_error(exc)
    return JSONResponse(with_rules(dictionary))


async def _modify(request: Request, change: Callable[[Dictionary], Dictionary]) -> Dictionary:
    """Change the path's dictionary under the store's lock (``DictionaryBackend.modify``).

    Raises:
        ProtocolError: none of the caller's has that id (``pronunciation_dictionary_not_found``), or what
            ``change`` raises.
    """
    dictionary_id = request.path_params["dictionary_id"]
    changed = await run_in_threadpool(_store(request).modify, _owner(request), dictionary_id, change)
    if changed is None:
        raise not_found(f"no pronunciation dictionary {dictionary_id!r} of this API key", "dictionary_id")
    return changed


async def _changed(
    request: Request, limit: int, change: Callable[[bytes], Callable[[Dictionary], Dictionary]]
) -> Response:
    """Answer a change of the path's dictionary that ``change`` makes of the request's body."""
    try:
        dictionary = await _modify(request, change(await read_body(request, limit)))
    except BodyTooLarge as exc:
        return _refused(ProtocolError(ErrorCode.REQUEST_TOO_LARGE, str(exc)))
    except ProtocolError as err:
        return _refused(err, 404 if err.code == ErrorCode.PRONUNCIATION_DICTIONARY_NOT_FOUND else None)
    except (DictionaryQuotaExceeded, VoiceStoreUnavailable) as exc:
        return _store_error(exc)
    return JSONResponse(version(dictionary) if request.method == "POST" else metadata(dictionary))


def _patched(body: bytes) -> Callable[[Dictionary], Dictionary]:
    patch = decoded(_decode_patch, body or b"{}", " body")
    name = _name(patch.name, "name")

    def change(dictionary: Dictionary) -> Dictionary:
        if name is not None:
            dictionary = msgspec.structs.replace(dictionary, name=name)
        if patch.archived is not None and patch.archived != (dictionary.archived_at is not None):
            archived_at = int(time.time()) if patch.archived else None
            dictionary = msgspec.structs.replace(dictionary, archived_at=archived_at)
        return dictionary

    return change


async def update_dictionary(request: Request) -> Response:
    """``PATCH /v1/pronunciation-dictionaries/{id}``: rename, archive (``archived: true``) or restore it."""
    return await _changed(request, MAX_PATCH_BYTES, _patched)


async def set_rules(request: Request) -> Response:
    """``POST .../{id}/set-rules``: these rules replace all of its rules (a new version)."""

    def change(body: bytes) -> Callable[[Dictionary], Dictionary]:
        rules = entries(decode_new_rules(body).rules)
        return lambda dictionary: new_version(dictionary, rules)

    return await _changed(request, MAX_RULES_BYTES, change)


async def add_rules(request: Request) -> Response:
    """``POST .../{id}/add-rules``: these rules join its own, each replacing one for the same words."""

    def change(body: bytes) -> Callable[[Dictionary], Dictionary]:
        rules = entries(decode_new_rules(body).rules)
        return lambda dictionary: new_version(dictionary, with_added(dictionary.rules, rules))

    return await _changed(request, MAX_RULES_BYTES, change)


async def remove_rules(request: Request) -> Response:
    """``POST .../{id}/remove-rules``: its rules for these words go (at least one must stay)."""

    def change(body: bytes) -> Callable[[Dictionary], Dictionary]:
        texts = decode_rule_strings(body).rule_strings
        return lambda dictionary: new_version(dictionary, without(dictionary.rules, texts))

    return await _changed(request, MAX_RULES_BYTES, change)


async def delete_dictionary(request: Request) -> Response:
    """``DELETE /v1/pronunciation-dictionaries/{id}`` (voxgate's own): remove it."""
    dictionary_id = request.path_params["dictionary_id"]
    try:
        deleted = await run_in_threadpool(_store(request).delete, _owner(request), dictionary_id)
    except VoiceStoreUnavailable as exc:
        return _store_error(exc)
    if not deleted:
        message = f"no pronunciation dictionary {dictionary_id!r} of this API key"
        return _refused(not_found(message, "dictionary_id"), 404)
    return JSONResponse({"status": "ok", "id": dictionary_id})


routes = [
    Route("/v1/pronunciation-dictionaries/add-from-file", add_from_file, methods=["POST"]),
    Route("/v1/pronunciation-dictionaries/add-from-rules", add_from_rules, methods=["POST"]),
    Route("/v1/pronunciation-dictionaries/{dictionary_id}/{version_id}/download", download, methods=["GET"]),
    Route("/v1/pronunciation-dictionaries/{dictionary_id}/set-rules", set_rules, methods=["POST"]),
    Route("/v1/pronunciation-dictionaries/{dictionary_id}/add-rules", add_rules, methods=["POST"]),
    Route("/v1/pronunciation-dictionaries/{dictionary_id}/remove-rules", remove_rules, methods=["POST"]),
    Route("/v1/pronunciation-dictionaries", list_dictionaries, methods=["GET"]),
    Route("/v1/pronunciation-dictionaries/{dictionary_id}", get_dictionary, methods=["GET"]),
    Route("/v1/pronunciation-dictionaries/{dictionary_id}", update_dictionary, methods=["PATCH"]),
    Route("/v1/pronunciation-dictionaries/{dictionary_id}", delete_dictionary, methods=["DELETE"]),
]
