"""Settings are declared once (gateway fields and each engine's own Struct) and read from the environment."""

from __future__ import annotations

import pytest
from voxgate.engine import ENGINES
from voxgate.engine.remote_settings import RemoteSettings
from voxgate.engine.vllm_omni import VllmOmniSettings
from voxgate.gateway.settings import Settings, options


def test_engine_settings_come_from_their_variables() -> None:
    settings = Settings.from_env(
        {
            "VOXGATE_UPSTREAMS": "http://a:1, http://b:2",
            "VOXGATE_UPSTREAM_BREAKER_FAILURES": "9",
            "VOXGATE_VLLM_MODEL": "Qwen/x",
            "VOXGATE_PORT": "9000",
        }
    )
    remote = settings.of(RemoteSettings)
    assert remote.upstreams == ("http://a:1", "http://b:2") and remote.upstream_breaker_failures == 9
    assert settings.engine_settings("remote") == remote
    assert settings.of(VllmOmniSettings).vllm_model == "Qwen/x" and settings.port == 9000


def test_flags_override_variables() -> None:
    settings = Settings.from_env({"VOXGATE_UPSTREAM_MODEL": "env"}, upstream_model="flag")
    assert settings.of(RemoteSettings).upstream_model == "flag"


def test_an_unknown_setting_is_refused() -> None:
    with pytest.raises(TypeError, match="bogus"):
        Settings.from_env({}, bogus=1)


def test_every_engine_has_its_settings_and_names_are_unique() -> None:
    assert set(Settings().engines) == set(ENGINES)
    names = [opt.name for opt in options()]
    assert len(names) == len(set(names))
    assert {opt.group for opt in options()} - {""} <= set(ENGINES)


def test_defaults_match_the_declarations() -> None:
    assert Settings.from_env({}).engines == Settings().engines
