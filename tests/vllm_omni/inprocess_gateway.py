"""voxgate's gateway on its in-process engine (``--engine vllm-omni``, engine/vllm_omni.py) over the CPU
engine client of server.py, in vllm-omni 0.30.0's env.

Run with the python of the env that `.ci/vllm_omni_env.sh` builds:

    python tests/vllm_omni/inprocess_gateway.py --port 8092 [--kind CustomVoice] [--host 127.0.0.1]

It is ``voxgate serve --engine vllm-omni`` (``voxgate.cli.serve``, defaults from ``VOXGATE_*``) where the
engine's ``AsyncOmni`` is server.py's ``CpuTtsEngineClient``: the engine builds every request with vllm-omni's
own speech serving code over that client (``engine.omni_requests``), as it does over a real ``AsyncOmni`` on
a GPU. So this gateway and server.py's vllm-omni server serve the same checkpoint folder from the same
engine client, each in its own process: what tells their CPU apart is the serving layer alone
(bench/vs_vllm_omni.py). The client logs ``generate ...`` and ``abort ...`` lines on stderr, as in server.py.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.vllm_omni.server import (  # noqa: E402
    CpuTtsEngineClient,
    deploy_config_path,
    install_import_shims,
    log,
    offline_defaults,
    repository_voxgate,
    server_parser,
    write_model_dir,
)


def main(argv: Sequence[str] | None = None) -> None:
    options = server_parser(__doc__).parse_args(argv)
    offline_defaults()
    install_import_shims()
    repository_voxgate()
    from voxgate.engine.vllm_omni import VllmOmniEngine
    from voxgate.gateway.settings import Settings

    from voxgate.cli import configure_logging, serve

    with tempfile.TemporaryDirectory(prefix="voxgate-inprocess-") as tmp:
        # The folder's last component names the variant, as Qwen's checkpoints do (and as server.py's).
        model_dir = write_model_dir(options.kind, Path(tmp) / f"Qwen3-TTS-12Hz-0.6B-{options.kind}")
        deploy_config = deploy_config_path()
        client = CpuTtsEngineClient(model_dir, True, deploy_config)
        engine = VllmOmniEngine(
            model=str(model_dir), deploy_config=deploy_config, omni_factory=lambda: client
        )
        voices = Path(tmp) / "voices"
        settings = Settings.from_env(
            host=options.host, port=options.port, engine="vllm-omni", voices_dir=str(voices)
        )
        configure_logging(settings)
        log(f"voxgate on the in-process engine over CpuTtsEngineClient ({options.kind}), port {options.port}")
        serve(settings, engine)


if __name__ == "__main__":
    main()
