#!/usr/bin/env bash
# GPU smoke test of voxgate's two vllm-omni paths (see docs/gpu.md). Needs Linux, an NVIDIA GPU with its
# driver, Python 3.12 and network access to PyPI and Hugging Face; it cannot run on a CPU-only machine.
#
#   (a) in-process:  voxgate serve --engine vllm-omni                     (AsyncOmni inside the gateway)
#   (b) server:      vllm-omni serve MODEL --omni  +  voxgate serve --engine remote in front of it
#       and, as a baseline for (b), vllm-omni's own WebSocket endpoint with no gateway in between.
#
# For each it prints time to first audio, real-time factor and a Whisper transcript (bench/gpu_smoke.py).
# The setups run one after another, so a single GPU holds one model at a time.
#
#   bash bench/gpu_smoke.sh [--dry-run] [--runs N] [--model ID] [--venv DIR] [--out DIR] [--skip-install]
set -euo pipefail

usage() {
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODEL=${VOXGATE_VLLM_MODEL:-Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice}
DEPLOY_CONFIG=${VOXGATE_VLLM_DEPLOY_CONFIG:-qwen3_tts.yaml}
PYTHON=${PYTHON:-python3.12}
VENV=${VENV:-$ROOT/.venv-gpu}
OUT=${OUT:-$ROOT/test-output/gpu-smoke}
RUNS=3
DRY_RUN=0
INSTALL=1
GATEWAY_PORT=${GATEWAY_PORT:-8000}
REMOTE_PORT=${REMOTE_PORT:-8001}
OMNI_PORT=${OMNI_PORT:-8091}
# The first start downloads weights (~2.5 GB for 0.6B) and captures CUDA graphs: ~2.5 min cold on a
# desktop GPU (REFERENCE.md D); this leaves room for a slow download.
STARTUP_TIMEOUT_S=${STARTUP_TIMEOUT_S:-1200}
# The remote gateway only has to find its upstream healthy.
GATEWAY_TIMEOUT_S=${GATEWAY_TIMEOUT_S:-120}

while (($#)); do
    case $1 in
        --dry-run) DRY_RUN=1 ;;
        --skip-install) INSTALL=0 ;;
        --runs) RUNS=${2:?--runs needs a number}; shift ;;
        --model) MODEL=${2:?--model needs a model id}; shift ;;
        --venv) VENV=${2:?--venv needs a folder}; shift ;;
        --out) OUT=${2:?--out needs a folder}; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

PIDS=()

say() { printf '\n=== %s\n' "$*"; }

# Print a command; run it unless --dry-run.
run() {
    printf '+ %s\n' "$*"
    if ((!DRY_RUN)); then "$@"; fi
}

# Start a server in its own process group (so that stopping it also stops the stage processes it
# spawns), logging to $OUT/NAME.log.
start() {
    local name=$1; shift
    printf '+ %s > %s 2>&1 &\n' "$*" "$OUT/$name.log"
    if ((DRY_RUN)); then return; fi
    setsid "$@" >"$OUT/$name.log" 2>&1 &
    PIDS+=("$!")
}

# Stop every server this script started: TERM to each process group, KILL what is left after 30 s.
stop_all() {
    local pid deadline
    ((${#PIDS[@]})) || return 0
    for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    deadline=$((SECONDS + 30))
    for pid in "${PIDS[@]}"; do
        while kill -0 -- "-$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 1; done
        kill -KILL -- "-$pid" 2>/dev/null || true
    done
    PIDS=()
}
trap stop_all EXIT
trap 'exit 130' INT TERM

# Wait until URL answers 200; fail early if the server started last has died.
wait_ready() {
    local url=$1 timeout_s=$2 name=$3 pid deadline
    printf '+ wait up to %ss for %s\n' "$timeout_s" "$url"
    if ((DRY_RUN)); then return; fi
    pid=${PIDS[-1]}
    deadline=$((SECONDS + timeout_s))
    until curl -fs -o /dev/null --max-time 5 "$url"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "$name exited during start-up; the end of $OUT/$name.log:" >&2
            tail -n 40 "$OUT/$name.log" >&2
            return 1
        fi
        if ((SECONDS >= deadline)); then
            echo "$name not ready after ${timeout_s}s; the end of $OUT/$name.log:" >&2
            tail -n 40 "$OUT/$name.log" >&2
            return 1
        fi
        sleep 2
    done
}

measure() {
    local label=$1 url=$2; shift 2
    run "$VENV/bin/python" "$ROOT/bench/gpu_smoke.py" --label "$label" --url "$url" --runs "$RUNS" \
        --out "$OUT" "$@"
}

if ((!DRY_RUN)); then
    command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this script needs an NVIDIA GPU" >&2; exit 1; }
    command -v curl >/dev/null || { echo "curl is needed to wait for the servers" >&2; exit 1; }
    mkdir -p "$OUT"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi

if ((INSTALL)); then
    say "install voxgate[vllm,test] into $VENV"
    run "$PYTHON" -m venv "$VENV"
    if command -v uv >/dev/null; then
        # uv picks the torch build that matches the installed CUDA driver, as vLLM's docs advise.
        run uv pip install --python "$VENV/bin/python" --torch-backend=auto -e "${ROOT}[vllm,test]"
    else
        run "$VENV/bin/pip" install -e "${ROOT}[vllm,test]"
    fi
fi

FAILED=()

in_process() {
    start gateway-in-process env VOXGATE_VLLM_MODEL="$MODEL" VOXGATE_VLLM_DEPLOY_CONFIG="$DEPLOY_CONFIG" \
        VOXGATE_VLLM_STAGE_INIT_TIMEOUT_S="$STARTUP_TIMEOUT_S" \
        "$VENV/bin/voxgate" serve --engine vllm-omni --host 127.0.0.1 --port "$GATEWAY_PORT"
    wait_ready "http://127.0.0.1:$GATEWAY_PORT/readyz" "$STARTUP_TIMEOUT_S" gateway-in-process || return 1
    measure in-process "ws://127.0.0.1:$GATEWAY_PORT/v1/audio/speech/stream"
}

omni_server() {
    start vllm-omni "$VENV/bin/vllm-omni" serve "$MODEL" --omni --deploy-config "$DEPLOY_CONFIG" \
        --host 127.0.0.1 --port "$OMNI_PORT"
    wait_ready "http://127.0.0.1:$OMNI_PORT/health" "$STARTUP_TIMEOUT_S" vllm-omni
}

remote() {
    start gateway-remote env VOXGATE_UPSTREAMS="http://127.0.0.1:$OMNI_PORT" \
        "$VENV/bin/voxgate" serve --engine remote --host 127.0.0.1 --port "$REMOTE_PORT"
    wait_ready "http://127.0.0.1:$REMOTE_PORT/readyz" "$GATEWAY_TIMEOUT_S" gateway-remote || return 1
    measure remote "ws://127.0.0.1:$REMOTE_PORT/v1/audio/speech/stream"
}

say "(a) in-process: voxgate --engine vllm-omni, $MODEL"
if ! in_process; then FAILED+=(in-process); fi
run stop_all

say "(b) vllm-omni server on :$OMNI_PORT, behind voxgate --engine remote on :$REMOTE_PORT"
if omni_server; then
    if ! remote; then FAILED+=(remote); fi
    if ! measure omni-direct "ws://127.0.0.1:$OMNI_PORT/v1/audio/speech/stream" --protocol vllm-omni; then
        FAILED+=(omni-direct)
    fi
else
    FAILED+=(remote omni-direct)
fi
run stop_all

if ((DRY_RUN)); then
    say "dry run: nothing was started"
    exit 0
fi
say "logs, WAVs and JSON are in $OUT"
if ((${#FAILED[@]})); then
    echo "FAILED: ${FAILED[*]}" >&2
    exit 1
fi
echo "all setups passed"
