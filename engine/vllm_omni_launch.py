"""How the vllm-omni engine starts vllm-omni: the checkpoint, its deploy config and stage options
(``engine.vllm_omni``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .base import EngineError
from .omni_requests import ServingTools

if TYPE_CHECKING:
    from .vllm_omni import OmniClient


@dataclass(frozen=True, slots=True)
class Launch:
    """``VllmOmniEngine``'s arguments for vllm-omni's ``AsyncOmni``."""

    model: str  #: Hugging Face id or local path of a checkpoint vllm-omni serves speech from
    deploy_config: str  #: vllm-omni deploy YAML (a name under ``vllm_omni/deploy/`` or a path)
    stage_init_timeout_s: float  #: how long each stage may take to start
    forced_aligner: str  #: vllm-omni's ``--forced-aligner`` model (word timestamps); empty: none

    def tools(self, omni: OmniClient) -> ServingTools:
        """vllm-omni's speech serving object over ``omni``."""
        return ServingTools(omni, self.model)

    def omni(self) -> OmniClient:
        """The real ``AsyncOmni``, its stage processes started (minutes)."""
        try:
            from vllm_omni import AsyncOmni
        except ImportError as exc:
            raise EngineError(
                "engine 'vllm-omni' needs the vllm extra (pip install 'voxgate[vllm]') and an NVIDIA GPU"
            ) from exc
        # vllm-omni 0.30.0 refuses stage_configs_path; deploy_config replaced it. Its other keywords are
        # the serve command's options (``forced_aligner`` is ``--forced-aligner``).
        extra: dict[str, Any] = {"forced_aligner": self.forced_aligner} if self.forced_aligner else {}
        try:
            omni: OmniClient = AsyncOmni(
                model=self.model,
                deploy_config=self.deploy_config,
                stage_init_timeout=int(self.stage_init_timeout_s),
                log_stats=False,
                **extra,
            )
        # The library boundary. Without a GPU platform 0.30.0 raises RuntimeError("Orchestrator
        # initialization failed: ") caused by a bare NotImplementedError from get_omni_ar_worker_cls;
        # the engine has shut its orchestrator down by then, and no object is left to shut down.
        except Exception as exc:
            root: BaseException = exc
            while root.__cause__ is not None or root.__context__ is not None:
                root = root.__cause__ or root.__context__  # type: ignore[assignment]
            raise EngineError(f"vllm-omni could not start {self.model}: {exc!r}, caused by {root!r}") from exc
        return omni
