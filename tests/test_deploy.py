"""The deployment files agree with each other, with the gateway's settings and with docs/deploy.md.

Static checks only: nothing here needs Docker, a GPU or the network. ``compose.yaml`` is read with
PyYAML (which resolves its ``<<: *gateway`` merge keys the way Compose does), ``${VAR:-default}``
interpolation is replaced by its default, and the result is checked against what the gateway, nginx and
vllm-omni expect of each other.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from voxgate.engine import ENGINES
from voxgate.engine.remote_settings import RemoteSettings
from voxgate.gateway.settings import Settings, options

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
DOCS = ROOT / "docs" / "deploy.md"

SERVICES = ("vllm", "gateway-1", "gateway-2", "proxy")
GATEWAYS = ("gateway-1", "gateway-2")
PREFIX = "VOXGATE_"
# Fields the lead is adding to Settings alongside this file; until they land, checks on them skip.
PENDING_FIELDS = frozenset({"upstreams", "upstream_model"})
# vllm-omni's recipe measured ~2.5 min for a cold start (recipes/Qwen/Qwen3-TTS-RTX4070TiSUPER.md):
# a shorter start_period would mark a healthy first start unhealthy and stop the gateways from starting.
MIN_VLLM_START_PERIOD_S = 150
HF_CACHE = "/root/.cache/huggingface"
_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us)")
_DURATION_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}

Services = dict[str, dict[str, Any]]


def _interpolate(value: Any) -> Any:
    """Compose's ``${VAR:-default}`` with nothing set in the environment: the default, or empty."""
    if isinstance(value, str):
        return _INTERPOLATION.sub(lambda m: m.group(2) or "", value)
    if isinstance(value, list):
        return [_interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: _interpolate(v) for k, v in value.items()}
    return value


def _seconds(duration: str) -> float:
    """A Compose duration (``1m30s``, ``10m``, ``30s``) in seconds."""
    parts = _DURATION.findall(duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"not a Compose duration: {duration!r}"
    return sum(float(n) * _DURATION_S[u] for n, u in parts)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    resolved = _interpolate(data)
    assert isinstance(resolved, dict)
    return resolved


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> Services:
    result = compose["services"]
    assert isinstance(result, dict)
    return result


def _env(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as a mapping, whichever of Compose's two forms it uses."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def _command(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or []
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def _flag(args: list[str], name: str) -> str:
    """The value after ``name`` (or of ``name=value``) in an argument list."""
    for i, arg in enumerate(args):
        if arg == name:
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{name} is not among {args}")


def _healthcheck(service: dict[str, Any]) -> str:
    test = service["healthcheck"]["test"]
    return " ".join(test) if isinstance(test, list) else str(test)


def _volume_mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> source, for short (``src:dst[:mode]``) and long volume syntax."""
    mounts: dict[str, str] = {}
    for volume in service.get("volumes") or []:
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume["source"], volume["target"]
        mounts[target] = source
    return mounts


def _vllm_port(services: Services) -> int:
    return int(_flag(_command(services["vllm"]), "--port"))


def _proxy_config(services: Services) -> Path:
    """The nginx file that compose.yaml mounts into the proxy."""
    for target, source in _volume_mounts(services["proxy"]).items():
        if target.startswith("/etc/nginx/"):
            return (ROOT / source).resolve()
    raise AssertionError("the proxy mounts no nginx configuration")


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continuation line"
    pairs = []
    for line in logical:
        instruction, _, arguments = line.strip().partition(" ")
        pairs.append((instruction.upper(), arguments.strip()))
    return pairs


# --- services -----------------------------------------------------------------------------------------


def test_the_services_the_docs_name_exist(services: Services) -> None:
    assert set(SERVICES) <= set(services), f"missing: {set(SERVICES) - set(services)}"


def test_vllm_reserves_one_nvidia_gpu(services: Services) -> None:
    devices = services["vllm"]["deploy"]["resources"]["reservations"]["devices"]
    assert len(devices) == 1
    (device,) = devices
    assert device["driver"] == "nvidia"
    assert device["count"] == 1
    assert "gpu" in device["capabilities"]


def test_vllm_serves_qwen3_tts_with_vllm_omni(services: Services) -> None:
    vllm = services["vllm"]
    args = [*vllm.get("entrypoint", []), *_command(vllm)]
    assert args[:2] == ["vllm", "serve"]
    assert args[2].startswith("Qwen/Qwen3-TTS-12Hz-"), args[2]
    assert "--omni" in args
    assert "qwen3_tts" in _flag(args, "--deploy-config")
    assert _vllm_port(services) == 8091
    # A bare `vllm/vllm-omni` would float to whatever `latest` is.
    image = vllm["image"]
    assert image.startswith("vllm/vllm-omni:v") and re.search(r":v\d+\.\d+\.\d+", image), image


def test_vllm_has_a_health_check_on_health_with_a_long_start_period(services: Services) -> None:
    vllm = services["vllm"]
    assert f"127.0.0.1:{_vllm_port(services)}/health" in _healthcheck(vllm)
    assert _seconds(vllm["healthcheck"]["start_period"]) >= MIN_VLLM_START_PERIOD_S


def test_vllm_keeps_the_model_cache_on_a_named_volume(compose: dict[str, Any], services: Services) -> None:
    vllm = services["vllm"]
    source = _volume_mounts(vllm)[HF_CACHE]
    assert source in (compose.get("volumes") or {}), f"{source} is not a named volume"
    # The image may move HOME; HF_HOME keeps the cache on the volume regardless.
    assert _env(vllm)["HF_HOME"] == HF_CACHE


def test_gateways_use_engine_remote_pointing_at_vllm(services: Services) -> None:
    port = _vllm_port(services)
    model = _command(services["vllm"])[0]
    for name in GATEWAYS:
        env = _env(services[name])
        assert env["VOXGATE_ENGINE"].split(",")[0].strip() == "remote", name
        upstreams = [u.strip() for u in env["VOXGATE_UPSTREAMS"].split(",") if u.strip()]
        assert upstreams == [f"http://vllm:{port}"], name
        # The model the gateway asks for must be the one vLLM serves.
        assert env["VOXGATE_UPSTREAM_MODEL"] == model, name
        assert env["VOXGATE_HOST"] == "0.0.0.0", name


def test_gateways_share_one_voices_volume(compose: dict[str, Any], services: Services) -> None:
    sources = set()
    for name in GATEWAYS:
        voices_dir = _env(services[name])["VOXGATE_VOICES_DIR"]
        mounts = _volume_mounts(services[name])
        assert voices_dir in mounts, f"{name} does not mount {voices_dir}"
        sources.add(mounts[voices_dir])
    assert len(sources) == 1, f"the gateways mount different voice stores: {sources}"
    assert sources <= set(compose.get("volumes") or {}), "the voice store is not a named volume"


def test_gateways_wait_for_vllm_to_be_healthy(services: Services) -> None:
    for name in GATEWAYS:
        assert services[name]["depends_on"]["vllm"]["condition"] == "service_healthy", name


def test_gateways_are_built_here_and_check_readyz(services: Services) -> None:
    for name in GATEWAYS:
        gateway = services[name]
        build = gateway["build"]
        context = build if isinstance(build, str) else build.get("context", ".")
        assert (ROOT / context / "Dockerfile").is_file(), name
        port = _env(gateway).get("VOXGATE_PORT", "8000")
        assert f"127.0.0.1:{port}/readyz" in _healthcheck(gateway), name
        # Only the proxy is reachable from outside; a published gateway would bypass it.
        assert not gateway.get("ports"), name


def test_the_gateways_settings_load(services: Services) -> None:
    """The gateways' environment, defaults filled in, is accepted by Settings and names known engines."""
    missing = PENDING_FIELDS - {opt.name for opt in options()}
    if missing:
        pytest.skip(f"Settings fields {sorted(missing)} are being added; the gateways need them")
    for name in GATEWAYS:
        settings = Settings.from_env(_env(services[name]))
        assert settings.host == "0.0.0.0" and settings.port == 8000, name
        assert {n.strip() for n in settings.engine.split(",")} <= set(ENGINES), name
        remote = settings.of(RemoteSettings)
        assert remote.upstreams and remote.upstream_model, name
        assert settings.all_api_keys() == (), f"{name}: compose.yaml's defaults must not invent keys"


# --- settings -----------------------------------------------------------------------------------------


def test_every_voxgate_variable_is_a_setting(services: Services) -> None:
    fields = {opt.env for opt in options()}
    used = {key for service in services.values() for key in _env(service) if key.startswith(PREFIX)}
    # Values like ${VOXGATE_API_KEYS:-} pass a shell variable on; its name must be a setting too.
    used |= {
        m.group(1)
        for m in _INTERPOLATION.finditer(COMPOSE.read_text(encoding="utf-8"))
        if m.group(1).startswith(PREFIX)
    }
    unknown = used - fields
    pending = {PREFIX + name.upper() for name in PENDING_FIELDS}
    if unknown and unknown <= pending:
        pytest.skip(f"Settings fields {sorted(unknown)} are being added; compose.yaml already uses them")
    assert not unknown, f"compose.yaml sets variables no Settings field reads: {sorted(unknown)}"


# --- proxy --------------------------------------------------------------------------------------------


def test_proxy_config_exists_and_carries_websockets(services: Services) -> None:
    config = _proxy_config(services)
    assert config.is_file(), f"{config} does not exist"
    text = config.read_text(encoding="utf-8")
    assert re.search(r"proxy_set_header\s+Upgrade\s+\$http_upgrade\s*;", text)
    assert re.search(r"proxy_set_header\s+Connection\s+\$connection_upgrade\s*;", text)
    assert re.search(r"map\s+\$http_upgrade\s+\$connection_upgrade", text)
    assert re.search(r"proxy_http_version\s+1\.1\s*;", text)
    assert re.search(r"proxy_buffering\s+off\s*;", text)


def test_proxy_balances_exactly_the_gateways(services: Services) -> None:
    text = _proxy_config(services).read_text(encoding="utf-8")
    upstream = re.search(r"upstream\s+(\w+)\s*\{(.*?)\}", text, re.S)
    assert upstream is not None, "no upstream block"
    servers = re.findall(r"^\s*server\s+([\w.-]+):(\d+)", upstream.group(2), re.M)
    gateways = sorted(n for n in services if n.startswith("gateway-"))
    assert sorted(host for host, _ in servers) == gateways
    for host, port in servers:
        assert port == _env(services[host]).get("VOXGATE_PORT", "8000"), host
    assert re.search(rf"proxy_pass\s+http://{upstream.group(1)}\s*;", text)


def test_proxy_timeouts_outlast_the_gateways_idle_timeout(services: Services) -> None:
    """The gateway must be the one that closes an idle session (with a close code), not nginx."""
    text = _proxy_config(services).read_text(encoding="utf-8")
    idle_s = max(float(_env(services[n]).get("VOXGATE_IDLE_TIMEOUT_S", "60")) for n in GATEWAYS)
    for directive in ("proxy_read_timeout", "proxy_send_timeout"):
        match = re.search(rf"{directive}\s+(\d+)s?\s*;", text)
        assert match is not None, f"{directive} is not set (nginx's default of 60 s cuts idle sessions)"
        assert float(match.group(1)) > idle_s, directive


def test_proxy_is_pinned_and_publishes_port_8000(services: Services) -> None:
    proxy = services["proxy"]
    assert re.fullmatch(r"nginx:\d+\.\d+\.\d+(-alpine)?", proxy["image"]), proxy["image"]
    published = [str(p) for p in proxy["ports"]]
    assert any(re.fullmatch(r"(?:[\d.]+:)?8000:80", p) for p in published), published


# --- Dockerfile ---------------------------------------------------------------------------------------


def test_dockerfile_runs_voxgate_serve_as_a_non_root_user() -> None:
    instructions = _dockerfile_instructions()
    cmd = [args for name, args in instructions if name == "CMD"][-1]
    argv = json.loads(cmd) if cmd.startswith("[") else shlex.split(cmd)
    assert argv[:2] == ["voxgate", "serve"]
    assert _flag(argv, "--host") == "0.0.0.0"
    user = [args for name, args in instructions if name == "USER"][-1]
    assert user.split(":")[0] not in ("root", "0")
    assert "8000" in [args for name, args in instructions if name == "EXPOSE"][-1].split()


def test_dockerfile_health_check_hits_readyz() -> None:
    (check,) = [args for name, args in _dockerfile_instructions() if name == "HEALTHCHECK"]
    assert "CMD" in check and "/readyz" in check


def test_dockerfile_starts_from_python_3_11_slim() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)", text, re.M)
    assert base is not None and base.group(1).startswith("python:3.11-slim"), base


def test_dockerignore_keeps_local_state_out_of_the_build() -> None:
    ignored = (ROOT / ".dockerignore").read_text(encoding="utf-8").split()
    for path in (".git", ".venv", ".pytest_cache", ".mypy_cache", "test-output"):
        assert path in ignored, path


# --- docs ---------------------------------------------------------------------------------------------


def test_docs_name_every_service_and_volume(compose: dict[str, Any], services: Services) -> None:
    docs = DOCS.read_text(encoding="utf-8")
    for name in [*services, *(compose.get("volumes") or {})]:
        assert f"`{name}`" in docs, f"docs/deploy.md does not mention `{name}`"


# --- monitoring profile -------------------------------------------------------------------------------

MONITORING = ("prometheus", "grafana")
PROMETHEUS = ROOT / "deploy" / "prometheus.yml"
GRAFANA = ROOT / "deploy" / "grafana"
_METRIC = re.compile(r"\bvoxgate_[a-z_]+")


def _dashboard_exprs() -> list[str]:
    dashboards = sorted((GRAFANA / "dashboards").glob("*.json"))
    assert dashboards, "no Grafana dashboard in deploy/grafana/dashboards"
    exprs = []
    for path in dashboards:
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        for panel in dashboard["panels"]:
            assert panel["datasource"]["uid"] == _datasource_uid(), panel["title"]
            exprs += [target["expr"] for target in panel["targets"]]
    return exprs


def _datasource_uid() -> str:
    provisioned = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    (source,) = provisioned["datasources"]
    assert source["url"] == "http://prometheus:9090"
    return str(source["uid"])


def _exported_names() -> set[str]:
    """Every sample name a real gateway's /metrics can carry, from the ``# TYPE`` lines of a scrape."""
    import httpx
    from voxgate.engine.fake import FakeEngine

    from tests.conftest import TIMEOUT_S, serve_engine

    with serve_engine(FakeEngine()) as address:
        text = httpx.get(f"http://{address}/metrics", timeout=TIMEOUT_S).text
    suffixes = {"histogram": ("_bucket", "_count", "_sum"), "counter": ("_total",), "gauge": ("",)}
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        base = name.removesuffix("_total") if kind == "counter" else name
        names |= {base + suffix for suffix in suffixes[kind]}
    return names


def test_monitoring_is_an_optional_profile_of_pinned_images(services: Services) -> None:
    for name in MONITORING:
        assert services[name]["profiles"] == ["monitoring"], name
        assert re.fullmatch(r"[\w/.-]+:v?\d+\.\d+\.\d+", services[name]["image"]), services[name]["image"]
    for name in services:
        if name not in MONITORING:
            assert "profiles" not in services[name], f"{name} must start without a profile"


def test_prometheus_scrapes_each_gateway_directly(services: Services) -> None:
    assert (ROOT / _volume_mounts(services["prometheus"])["/etc/prometheus/prometheus.yml"]).resolve() == (
        PROMETHEUS
    )
    config = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    targets = [t for group in job["static_configs"] for t in group["targets"]]
    port = _env(services["gateway-1"])["VOXGATE_PORT"]
    assert sorted(targets) == [f"{name}:{port}" for name in GATEWAYS]
    for name in GATEWAYS:
        assert _env(services[name])["VOXGATE_METRICS_PUBLIC"] == "true"  # no key in prometheus.yml


def test_grafana_is_provisioned_with_the_dashboard(services: Services) -> None:
    mounts = _volume_mounts(services["grafana"])
    assert (ROOT / mounts["/etc/grafana/provisioning"]).resolve() == GRAFANA / "provisioning"
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "voxgate.yml").read_text())
    (source,) = provider["providers"]
    assert (ROOT / mounts[source["options"]["path"]]).resolve() == GRAFANA / "dashboards"


def test_every_dashboard_query_names_a_metric_the_gateway_exports() -> None:
    exported = _exported_names()
    used = {name for expr in _dashboard_exprs() for name in _METRIC.findall(expr)}
    assert used, "the dashboard queries no voxgate metric"
    assert used <= exported, f"not exported: {sorted(used - exported)}"


def test_the_proxy_does_not_serve_metrics(services: Services) -> None:
    config = _proxy_config(services).read_text(encoding="utf-8")
    assert re.search(r"location = /metrics \{\s*return 404;", config)


# --- the image alone: what the docs say `docker run` does, it does ----------------------------------------


def _docker_commands(text: str) -> list[tuple[str, list[str]]]:
    """Every ``docker build`` / ``docker run`` in ``text`` (continuations joined, ``#`` comment prefixes of a
    Dockerfile's continued lines too), as (verb, arguments), in order."""
    joined = re.sub(r"\\\n[#\s]*", " ", text)
    found = re.finditer(r"docker (build|run) ([^`\n&|;()]*)", joined)
    return [(m[1], shlex.split(m[2])) for m in found]


def _options(args: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """(options with their values, positional arguments) of a docker command line."""
    valued = {"-p", "-e", "-v", "-t", "--name", "--build-arg", "--env", "--tag", "--publish", "--volume"}
    options: dict[str, list[str]] = {}
    positional: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in valued and i + 1 < len(args):
            options.setdefault(arg, []).append(args[i + 1])
            i += 2
            continue
        if not arg.startswith("-"):
            positional.append(arg)
        i += 1
    return options, positional


def _image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for name, args in _dockerfile_instructions():
        if name == "ENV":
            env.update(pair.split("=", 1) for pair in shlex.split(args) if "=" in pair)  # type: ignore[misc]
    return env


def _image_runs() -> list[tuple[str, str, dict[str, str], set[str]]]:
    """Each ``docker run`` the Dockerfile and docs/deploy.md show: (where, image, environment, extras)."""
    default_extras = re.search(r'^ARG EXTRAS="([^"]*)"', DOCKERFILE.read_text(encoding="utf-8"), re.M)
    assert default_extras is not None
    runs = []
    for where, path in (("Dockerfile", DOCKERFILE), ("docs/deploy.md", DOCS)):
        built: dict[str, set[str]] = {}
        for verb, args in _docker_commands(path.read_text(encoding="utf-8")):
            options, positional = _options(args)
            if verb == "build":
                extras = {
                    e
                    for a in options.get("--build-arg", [])
                    if a.startswith("EXTRAS=")
                    for e in a[7:].split(",")
                }
                for tag in options.get("-t", []):
                    built[tag] = {e for e in extras if e}
                continue
            image = positional[0]
            env = {**_image_env(), **dict(e.split("=", 1) for e in options.get("-e", []) if "=" in e)}
            extras = built.get(image, {e for e in default_extras.group(1).split(",") if e})
            runs.append((where, image, env, extras))
    return runs


def test_the_docs_and_the_dockerfile_show_docker_runs_of_the_image() -> None:
    wheres = {where for where, *_ in _image_runs()}
    assert wheres == {"Dockerfile", "docs/deploy.md"}


@pytest.mark.parametrize("run", _image_runs(), ids=lambda r: f"{r[0]}:{r[1]}")
def test_each_docker_run_shown_starts_its_engines(run: tuple[str, str, dict[str, str], set[str]]) -> None:
    """What ``voxgate serve`` checks before it starts (else it exits 2), for the image's environment plus the
    command's ``-e``, and the extras its ``docker build`` installed."""
    from voxgate.gateway.app import engine_names

    where, image, env, extras = run
    settings = Settings.from_env({k: v for k, v in env.items() if k.startswith("VOXGATE_")})
    for name in engine_names(settings):
        entry = ENGINES[name]
        if entry.requires:
            assert entry.extra in extras, (
                f"{where}: {image} runs engine {name!r} without the {entry.extra!r} extra"
            )
        if entry.invalid is not None:
            problem = entry.invalid(settings.engine_settings(name))
            assert problem is None, f"{where}: docker run {image}: engine {name!r} {problem}"


def test_the_docs_name_the_images_default_engine() -> None:
    docs = DOCS.read_text(encoding="utf-8")
    stated = re.findall(r"default engine is (?:still )?`([\w,-]+)`", docs)
    assert stated and set(stated) == {_image_env()["VOXGATE_ENGINE"]}, stated
