"""``redact_url`` and ``Upstream.scrub``: how an upstream is named outside its own requests (issue 35 M6)."""

from __future__ import annotations

import logging

import pytest
from voxgate.engine.remote_answers import refusal, retry_after
from voxgate.engine.upstreams import ScrubUrls, Upstream, UpstreamPool, redact_url


@pytest.mark.parametrize(
    ("url", "label"),
    [
        ("http://vllm:8091", "http://vllm:8091"),
        ("http://user:PASS@vllm:8091/prefix/v1?token=abc#frag", "http://vllm:8091"),
        ("https://user@tts.internal", "https://tts.internal"),
        ("http://[::1]:9000/x", "http://[::1]:9000"),
        ("http://host:notaport/", "http://?"),
    ],
)
def test_a_url_is_named_by_scheme_host_and_port(url: str, label: str) -> None:
    assert redact_url(url) == label


def test_scrub_leaves_out_the_url_and_its_credentials() -> None:
    upstream = Upstream("http://voxuser:s3cr3t-PASS@10.0.0.5:8091/prefix")
    text = (
        "GET http://voxuser:s3cr3t-PASS@10.0.0.5:8091/prefix/health; login voxuser:s3cr3t-PASS@; s3cr3t-PASS"
    )
    assert upstream.scrub(text) == "GET http://10.0.0.5:8091/health; login ; ***"
    # A password short enough to be part of words is left out only as ``user:password@``.
    short = Upstream("http://u:ab@h:1")
    assert short.scrub("about u:ab@h:1 table") == "about h:1 table"


def test_the_pool_records_and_describes_failures_scrubbed() -> None:
    pool = UpstreamPool(["http://u:s3cr3t-PASS@h:1/p"], breaker_failures=1)
    pool.failure(pool.upstreams[0], "cannot connect to http://u:s3cr3t-PASS@h:1/p/v1/audio/speech")
    assert pool.describe() == "http://h:1: down (cannot connect to http://h:1/v1/audio/speech)"


def test_the_http_clients_log_is_scrubbed() -> None:
    pool = UpstreamPool(["http://u:s3cr3t-PASS@h:1"])
    record = logging.LogRecord("httpx", logging.INFO, __file__, 1, "HTTP Request: %s %s", ("GET", "x"), None)
    record.args = ("GET", "http://u:s3cr3t-PASS@h:1/health")
    assert ScrubUrls(pool).filter(record)
    assert record.getMessage() == "HTTP Request: GET http://h:1/health"


def test_a_refusal_relays_only_the_message_its_json_names() -> None:
    body: dict[str, object] = {"input": "x", "language": "Xx"}
    named = b'{"error": {"message": "Invalid language \'Xx\'\\n\\u001b[31mred", "param": null}}'
    assert (
        str(refusal(400, named, body)) == "upstream refused the request (400): Invalid language 'Xx' [31mred"
    )
    assert (
        str(refusal(400, b"<html>Traceback at 10.0.0.7</html>", body)) == "upstream refused the request (400)"
    )
    long = b'{"detail": "' + b"x" * 5000 + b'"}'
    assert len(str(refusal(422, long, body))) < 400


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("7", 7), (None, 1), ("0", 1), ("99999999999", 300), ("soon", 1), ("Wed, 21 Oct 2015 07:28:00 GMT", 1)],
)
def test_retry_after_is_read_and_bounded(header: str | None, seconds: int) -> None:
    assert retry_after(header) == seconds
