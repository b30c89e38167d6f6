"""The REST voice routes over real HTTP: uploads in each format, every refusal, keys, shared folders."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import numpy as np
import numpy.typing as npt
import pytest
import soundfile
import soxr
from starlette.applications import Starlette
from starlette.middleware import Middleware
from voxgate.engine.base import Voice
from voxgate.gateway.middleware.auth import AuthMiddleware, owner_of
from voxgate.gateway.middleware.http import Rejected
from voxgate.gateway.routes import voices
from voxgate.gateway.routes.multipart import read_form
from voxgate.gateway.voices.clips import MAX_AUDIO_BYTES
from voxgate.gateway.voices.local import VoiceStore

from tests.conftest import TIMEOUT_S, serve
from tests.gateway import voice_server

URL = "/v1/audio/voices"
INFO_FIELDS = {
    "name", "consent", "created_at", "kind", "sample_rate", "duration_s", "embedding_dim", "ref_text",
    "speaker_description", "mime_type", "file_size", "embedding_source", "engines", "requires",
}  # fmt: skip


def samples(
    seconds: float = 1.5, rate: int = 16000, channels: int = 1, seed: int = 0
) -> npt.NDArray[np.float32]:
    noise = np.random.default_rng(seed).uniform(-0.5, 0.5, (int(seconds * rate), channels))
    return noise.astype(np.float32)


def encode(
    data: npt.NDArray[np.float32], rate: int = 16000, fmt: str = "WAV", subtype: str | None = None
) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, data, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def decoded(data: bytes) -> npt.NDArray[np.float32]:
    """What the gateway should store for an upload: the client-side decode, mixed down to mono, resampled
    to 24 kHz when above, as 16-bit PCM."""
    audio, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    mono = audio.mean(axis=1, dtype=np.float32)
    if rate > 24000:
        mono = soxr.resample(mono, rate, 24000, quality="HQ")
    pcm: npt.NDArray[np.float32] = (np.clip(np.rint(mono * 32768), -32768, 32767) / 32768).astype(np.float32)
    return pcm


WAV = encode(samples())


def post(
    client: httpx.Client,
    name: str | None = "v",
    *,
    audio: bytes | None = WAV,
    embedding: str | None = None,
    consent: str | None = "speaker agreed on 2024-05-01",
    **fields: str,
) -> httpx.Response:
    """A multipart upload with the given fields; None leaves a field out."""
    form: dict[str, str] = {
        k: v for k, v in {"name": name, "consent": consent, **fields}.items() if v is not None
    }
    files: dict[str, tuple[str | None, bytes | str, str] | tuple[None, str]] = {}
    if audio is not None:
        files["audio_sample"] = ("clip.bin", audio, "application/octet-stream")
    if embedding is not None:
        files["speaker_embedding"] = (None, embedding)
    if not files:
        files["note"] = (None, "")  # keeps the body multipart
    return client.post(URL, data=form, files=files)


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, object]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error" and error["message"], error
    assert isinstance(error, dict)
    return error


class Catalog:
    clip_rate_hz = 24000

    async def builtin_voices(self) -> list[Voice]:
        return [Voice(name="joe", engine="piper"), Voice(name="amy", engine="piper")]

    def cloning_engines(self) -> list[str]:
        return ["vllm-omni"]


@contextlib.contextmanager
def gateway(
    directory: Path, *, keys: tuple[str, ...] = (), max_voices: int = 1000, catalog: Catalog | None = None
) -> Iterator[tuple[str, VoiceStore]]:
    """The voice routes on a real uvicorn in this process; yields the base URL and the store."""
    store = VoiceStore(directory, max_voices=max_voices)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, object]]:
        yield {"voices": store} if catalog is None else {"voices": store, "catalog": catalog}

    middleware = [Middleware(AuthMiddleware, keys=keys)] if keys else []
    with serve(Starlette(routes=voices.routes, lifespan=lifespan, middleware=middleware)) as address:
        yield f"http://{address}", store


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, VoiceStore, Path]]:
    directory = tmp_path_factory.mktemp("voices")
    with (
        gateway(directory, max_voices=50) as (url, store),
        httpx.Client(base_url=url, timeout=TIMEOUT_S) as client,
    ):
        yield client, store, directory


@pytest.fixture
def client(shared: tuple[httpx.Client, VoiceStore, Path]) -> httpx.Client:
    return shared[0]


# --- uploads that succeed ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "subtype", "rate", "mime"),
    [
        ("WAV", "PCM_16", 16000, "audio/wav"),
        ("WAV", "FLOAT", 24000, "audio/wav"),
        ("FLAC", "PCM_16", 22050, "audio/flac"),
        ("OGG", "VORBIS", 16000, "audio/ogg"),
        ("OGG", "OPUS", 48000, "audio/ogg"),
        ("MP3", "MPEG_LAYER_III", 16000, "audio/mpeg"),
    ],
)
def test_upload_each_format(
    shared: tuple[httpx.Client, VoiceStore, Path], fmt: str, subtype: str, rate: int, mime: str
) -> None:
    client, store, directory = shared
    data = encode(samples(2.0, rate, channels=2, seed=rate), rate, fmt, subtype)
    name = f"{fmt}-{subtype}"
    response = post(client, name, audio=data, ref_text="hello there", speaker_description="calm")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["success"] is True and set(body["voice"]) == INFO_FIELDS
    voice = body["voice"]
    assert (voice["name"], voice["kind"], voice["sample_rate"], voice["mime_type"]) == (
        name,
        "audio",
        min(rate, 24000),
        mime,
    )
    assert (voice["ref_text"], voice["speaker_description"], voice["requires"]) == (
        "hello there",
        "calm",
        "cloning",
    )
    assert voice["duration_s"] == pytest.approx(2.0, abs=0.1)
    assert str(directory) not in response.text and ".safetensors" not in response.text
    stored = store.get("", name)
    assert stored is not None and stored.audio is not None
    # Stereo is mixed down, over 24 kHz resampled, then stored as 16-bit PCM (mpg123 decodes a few samples
    # 1 ulp apart on a re-read, which may round to the next 16-bit step).
    np.testing.assert_allclose(stored.audio, decoded(data), rtol=0, atol=1 / 32768 + 1e-6)


def test_upload_embedding_multipart_and_urlencoded(client: httpx.Client) -> None:
    values = [0.25, -1, 3e-3, 7]
    response = post(client, "emb-multipart", audio=None, embedding=json.dumps(values))
    assert response.status_code == 200, response.text
    assert (response.json()["voice"]["kind"], response.json()["voice"]["embedding_dim"]) == ("embedding", 4)
    form = {"name": "emb-urlencoded", "consent": "ok", "speaker_embedding": json.dumps(values)}
    response = client.post(URL, data=form)
    assert response.status_code == 200, response.text
    assert response.json()["voice"]["embedding_dim"] == 4


def test_list_details_replace_delete(tmp_path: Path) -> None:
    with gateway(tmp_path, catalog=Catalog()) as (url, store), httpx.Client(base_url=url) as client:
        empty = client.get(URL).json()
        assert {k: empty[k] for k in ("voices", "uploaded_voices")} == {
            "voices": ["joe", "amy"],
            "uploaded_voices": [],
        }
        assert [(d["name"], d["engines"], d["requires"]) for d in empty["voice_details"]] == [
            ("joe", ["piper"], None),
            ("amy", ["piper"], None),
        ]
        assert client.get(f"{URL}/joe").json()["kind"] == "builtin"
        assert post(client, "zed").status_code == 200
        assert post(client, "ann", audio=None, embedding="[1, 2, 3]").status_code == 200
        listing = client.get(URL).json()
        # Every name a request may use, uploaded ones too, as vllm-omni lists them.
        assert listing["voices"] == ["joe", "amy", "ann", "zed"]
        assert [v["embedding_source"] for v in listing["uploaded_voices"]] == ["direct", "audio"]
        assert listing["cloning_engines"] == ["vllm-omni"]  # what a page needs to offer uploads or not
        assert [v["name"] for v in listing["uploaded_voices"]] == ["ann", "zed"]
        assert all(
            v["engines"] == ["vllm-omni"] and set(v) == INFO_FIELDS for v in listing["uploaded_voices"]
        )

        details = client.get(f"{URL}/zed")
        assert details.status_code == 200 and details.json() == listing["uploaded_voices"][1]
        created = details.json()["created_at"]

        replacement = encode(samples(3.0, seed=7))
        replaced = post(client, "zed", audio=replacement, consent="second consent")
        assert replaced.status_code == 200
        after = client.get(f"{URL}/zed").json()
        assert after["consent"] == "second consent" and after["duration_s"] == pytest.approx(3.0)
        assert after["created_at"] >= created
        stored = store.get("", "zed")
        assert stored is not None and stored.audio is not None
        np.testing.assert_array_equal(stored.audio, decoded(replacement))
        assert len(client.get(URL).json()["uploaded_voices"]) == 2

        deleted = client.delete(f"{URL}/zed")
        assert deleted.status_code == 200
        assert deleted.json() == {"success": True, "message": "Voice 'zed' deleted successfully"}
        assert_error(client.get(f"{URL}/zed"), 404, "voice_not_found")
        assert_error(client.delete(f"{URL}/zed"), 404, "voice_not_found")
        assert [v["name"] for v in client.get(URL).json()["uploaded_voices"]] == ["ann"]
        name = "with space é"
        assert post(client, name).status_code == 200
        assert client.get(f"{URL}/{name}").json()["name"] == name  # httpx percent-encodes it
        assert client.delete(f"{URL}/{name}").status_code == 200


def test_no_catalog_means_no_builtin_voices_or_engines(client: httpx.Client) -> None:
    assert post(client, "plain").status_code == 200
    listing = client.get(URL).json()
    # No built-in voice: the names are the uploaded ones only.
    assert listing["voices"] == [v["name"] for v in listing["uploaded_voices"]]
    assert "plain" in listing["voices"] and listing["cloning_engines"] == []
    assert next(v for v in listing["uploaded_voices"] if v["name"] == "plain")["engines"] == []


# --- every refusal -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "x" * 65, "a/b", "a\\b", "a\0b", ".", ".."])
def test_bad_names(client: httpx.Client, name: str) -> None:
    error = assert_error(post(client, name), 400, "invalid_name")
    assert error["param"] == "name"


@pytest.mark.parametrize(
    ("embedding", "code"),
    [
        ("[]", "empty_embedding"),
        (json.dumps([0.5] * 8193), "embedding_too_long"),
        ('["a", 1]', "invalid_embedding"),
        ("[true, 1]", "invalid_embedding"),
        ('{"a": 1}', "invalid_embedding"),
        ("[[1, 2]]", "invalid_embedding"),
        ("not json", "invalid_embedding"),
        ("[" * 100_000, "invalid_embedding"),
        ("[1, NaN]", "embedding_not_finite"),
        ("[1, Infinity]", "embedding_not_finite"),
        ("[1e999]", "embedding_not_finite"),
        ("[1e39]", "embedding_not_finite"),  # finite in float64, infinite in float32
        ("[" + "9" * 400 + "]", "embedding_not_finite"),
    ],
)
def test_bad_embeddings(client: httpx.Client, embedding: str, code: str) -> None:
    error = assert_error(post(client, audio=None, embedding=embedding), 400, code)
    assert error["param"] == "speaker_embedding"


def test_largest_embedding_is_accepted(client: httpx.Client) -> None:
    # vllm-omni's bound on an uploaded embedding (upload_voice_embedding): 4096 values, not the 8192 a
    # request's speaker_embedding may have.
    values = np.random.default_rng(3).standard_normal(4096).tolist()
    response = post(client, "big-embedding", audio=None, embedding=json.dumps(values))
    assert response.status_code == 200, response.text[:300]
    assert response.json()["voice"]["embedding_dim"] == 4096
    assert response.json()["voice"]["embedding_source"] == "direct"
    refused = post(client, "too-big-embedding", audio=None, embedding=json.dumps([*values, 0.5]))
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "embedding_too_long"


@pytest.mark.parametrize(
    ("audio", "status", "code"),
    [
        (b"definitely not audio" * 100, 415, "unsupported_audio"),
        (encode(samples(0.5)), 400, "invalid_duration"),
        (encode(samples(30.5, rate=8000), rate=8000), 400, "invalid_duration"),
        (encode(np.full((16000, 1), np.nan, np.float32), subtype="FLOAT"), 400, "invalid_audio"),
        (encode(samples(2.0, rate=4000), rate=4000), 400, "invalid_audio"),
    ],
    ids=["garbage", "short", "long", "nan", "low-rate"],
)
def test_bad_audio(client: httpx.Client, audio: bytes, status: int, code: str) -> None:
    assert_error(post(client, audio=audio), status, code)


def test_durations_at_the_limits_are_accepted(client: httpx.Client) -> None:
    assert post(client, "one-second", audio=encode(samples(1.0))).status_code == 200
    assert post(client, "thirty", audio=encode(samples(30.0, rate=8000), rate=8000)).status_code == 200


def test_missing_fields(client: httpx.Client) -> None:
    assert_error(post(client, None), 400, "missing_name")
    assert_error(post(client, consent=None), 400, "missing_consent")
    assert_error(post(client, consent="  "), 400, "missing_consent")
    assert_error(post(client, audio=None), 400, "missing_voice_source")
    assert_error(post(client, audio=b""), 400, "missing_voice_source")  # a browser's empty file input
    assert_error(post(client, embedding="[1, 2]"), 400, "ambiguous_voice_source")


def test_oversized_parts_are_refused_while_reading(client: httpx.Client) -> None:
    too_big = b"\0" * (MAX_AUDIO_BYTES + 1)
    assert assert_error(post(client, audio=too_big), 413, "audio_too_large")["param"] == "audio_sample"
    assert_error(post(client, consent="c" * (voices.MAX_TEXT_BYTES + 1)), 413, "field_too_large")
    huge_embedding = "[" + "0.1," * (voices.MAX_EMBEDDING_BYTES // 4) + "0]"
    assert_error(post(client, audio=None, embedding=huge_embedding), 413, "field_too_large")
    urlencoded = {"name": "v", "consent": "c", "speaker_embedding": "1" * (voices.MAX_URLENCODED_BYTES + 1)}
    assert_error(client.post(URL, data=urlencoded), 413, "request_too_large")
    assert client.get(URL).status_code == 200  # the server is fine afterwards


def test_declared_length_over_the_limit_is_refused_before_reading(client: httpx.Client) -> None:
    assert_error(post(client, audio=b"\0" * (voices.MAX_BODY_BYTES + 1)), 413, "request_too_large")


def raw(client: httpx.Client, body: bytes, content_type: str) -> httpx.Response:
    return client.post(URL, content=body, headers={"content-type": content_type})


def multipart(*parts: tuple[str, bytes], boundary: str = "XyZ", end: bool = True) -> bytes:
    chunks = [f"--{boundary}\r\n{headers}\r\n\r\n".encode() + value + b"\r\n" for headers, value in parts]
    return b"".join(chunks) + (f"--{boundary}--\r\n".encode() if end else b"")


NAME = ('Content-Disposition: form-data; name="name"', b"v")
CONSENT = ('Content-Disposition: form-data; name="consent"', b"yes")
EMBEDDING = ('Content-Disposition: form-data; name="speaker_embedding"', b"[1, 2]")
MULTIPART = "multipart/form-data; boundary=XyZ"


def test_chunked_body_over_the_limit_is_refused_while_streaming(client: httpx.Client) -> None:
    def body() -> Iterator[bytes]:
        yield multipart(('Content-Disposition: form-data; name="name"', b"epilogue"), CONSENT, EMBEDDING)
        # An epilogue after the closing boundary belongs to no part, so only the body count stops it.
        for _ in range(voices.MAX_BODY_BYTES // 65536 + 2):
            yield b"x" * 65536

    response = client.post(URL, content=body(), headers={"content-type": MULTIPART})
    assert_error(response, 413, "request_too_large")
    assert_error(client.get(f"{URL}/epilogue"), 404, "voice_not_found")


def test_read_form_stops_reading_at_the_limit() -> None:
    consumed = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal consumed
        yield multipart(NAME, CONSENT, EMBEDDING)
        while True:
            consumed += 65536
            yield b"x" * 65536

    with pytest.raises(Rejected) as raised:
        asyncio.run(read_form(MULTIPART, endless(), voices.LIMITS))
    assert (raised.value.status, raised.value.code) == (413, "request_too_large")
    assert consumed <= voices.MAX_BODY_BYTES + 65536


def test_raw_multipart_is_accepted(client: httpx.Client) -> None:
    assert raw(client, multipart(NAME, CONSENT, EMBEDDING), MULTIPART).status_code == 200


@pytest.mark.parametrize(
    ("body", "content_type", "status", "code"),
    [
        (b'{"name": "v"}', "application/json", 415, "unsupported_content_type"),
        (b"", "", 415, "unsupported_content_type"),
        (multipart(NAME, CONSENT, EMBEDDING), "multipart/form-data", 400, "invalid_multipart"),
        (multipart(NAME, CONSENT, EMBEDDING, end=False), MULTIPART, 400, "invalid_multipart"),
        (b"garbage without any boundary", MULTIPART, 400, "invalid_multipart"),
        (multipart(("Content-Disposition: form-data", b"x"), NAME), MULTIPART, 400, "invalid_multipart"),
        (multipart(("Content-Disposition form-data", b"x"), NAME), MULTIPART, 400, "invalid_multipart"),
        (multipart(NAME, NAME, CONSENT, EMBEDDING), MULTIPART, 400, "duplicate_field"),
        (
            multipart(*[(f'Content-Disposition: form-data; name="f{i}"', b"") for i in range(17)]),
            MULTIPART,
            400,
            "too_many_fields",
        ),
        (
            multipart(('Content-Disposition: form-data; name="name"', b"\xff\xfe"), CONSENT, EMBEDDING),
            MULTIPART,
            400,
            "invalid_field",
        ),
        (
            b"name=v&consent=yes&speaker_embedding=%5B1%5D&junk",
            "application/x-www-form-urlencoded",
            400,
            "invalid_form",
        ),
        (b"name=\xff&consent=yes", "application/x-www-form-urlencoded", 400, "invalid_form"),
    ],
    ids=[
        "json",
        "no-type",
        "no-boundary",
        "unterminated",
        "garbage",
        "no-name",
        "bad-header",
        "duplicate",
        "too-many",
        "not-utf8",
        "bad-urlencoded",
        "urlencoded-not-utf8",
    ],  # fmt: skip
)
def test_malformed_bodies(
    client: httpx.Client, body: bytes, content_type: str, status: int, code: str
) -> None:
    assert_error(raw(client, body, content_type), status, code)


def test_voice_cap(tmp_path: Path) -> None:
    with gateway(tmp_path, max_voices=2) as (url, _), httpx.Client(base_url=url) as client:
        assert post(client, "a").status_code == 200
        assert post(client, "b").status_code == 200
        assert_error(post(client, "c"), 409, "voice_limit_reached")
        assert post(client, "b", consent="replacing is fine").status_code == 200
        assert client.delete(f"{URL}/a").status_code == 200
        assert post(client, "c").status_code == 200


# --- keys and processes -------------------------------------------------------------------------------


def test_api_keys_isolate_voices(tmp_path: Path) -> None:
    with gateway(tmp_path, keys=("key-a", "key-b")) as (url, store), httpx.Client(base_url=url) as anonymous:
        a = httpx.Client(base_url=url, headers={"authorization": "Bearer key-a"})
        b = httpx.Client(base_url=url, headers={"authorization": "Bearer key-b"})
        with a, b:
            assert post(a, "mine").status_code == 200
            assert [v["name"] for v in a.get(URL).json()["uploaded_voices"]] == ["mine"]
            assert b.get(URL).json()["uploaded_voices"] == []
            assert_error(b.get(f"{URL}/mine"), 404, "voice_not_found")
            assert_error(b.delete(f"{URL}/mine"), 404, "voice_not_found")
            assert store.get(owner_of("key-b"), "mine") is None  # so no engine can speak it for key B
            assert store.get(owner_of("key-a"), "mine") is not None
            assert a.get(f"{URL}/mine").status_code == 200

            other = encode(samples(seed=5))
            assert post(b, "mine", audio=other).status_code == 200  # B's own voice of the same name
            stored_a, stored_b = store.get(owner_of("key-a"), "mine"), store.get(owner_of("key-b"), "mine")
            assert stored_a is not None and stored_b is not None and stored_b.audio is not None
            np.testing.assert_array_equal(stored_b.audio, decoded(other))
            assert stored_a.info.created_at <= stored_b.info.created_at

            for response in (anonymous.get(URL), post(anonymous, "x"), anonymous.delete(f"{URL}/mine")):
                assert_error(response, 401, "invalid_api_key")
            wrong = httpx.Client(base_url=url, headers={"authorization": "Bearer key-c"})
            with wrong:
                assert_error(wrong.get(URL), 401, "invalid_api_key")
            assert a.delete(f"{URL}/mine").status_code == 200
            assert b.get(f"{URL}/mine").status_code == 200


def test_two_processes_share_one_folder(tmp_path: Path) -> None:
    with voice_server.running(tmp_path) as first, voice_server.running(tmp_path) as second:
        one = httpx.Client(base_url=first, timeout=TIMEOUT_S)
        two = httpx.Client(base_url=second, timeout=TIMEOUT_S)
        with one, two:
            assert post(one, "shared", consent="from one").status_code == 200
            assert [v["consent"] for v in two.get(URL).json()["uploaded_voices"]] == ["from one"]
            assert post(two, "shared", consent="from two", audio=encode(samples(2.5))).status_code == 200
            details = one.get(f"{URL}/shared").json()
            assert (details["consent"], details["duration_s"]) == ("from two", pytest.approx(2.5))
            assert two.delete(f"{URL}/shared").status_code == 200
            assert one.get(URL).json()["uploaded_voices"] == []
            assert_error(one.get(f"{URL}/shared"), 404, "voice_not_found")
            assert_error(one.delete(f"{URL}/shared"), 404, "voice_not_found")


def test_an_upload_may_not_take_a_builtin_voice_name(tmp_path: Path) -> None:
    with gateway(tmp_path, catalog=Catalog()) as (url, store), httpx.Client(base_url=url) as client:
        for name in ("joe", "Amy"):
            error = assert_error(post(client, name), 409, "name_taken")
            assert error["param"] == "name"
        assert post(client, "joey").status_code == 200
        assert [v.name for v in store.list("")] == ["joey"]
