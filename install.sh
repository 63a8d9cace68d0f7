#!/usr/bin/env bash
# Install ragutil and everything its tests need on a fresh Debian machine with Python >= 3.11:
# Chromium (the headless UI test drives it; skipped when it cannot be installed) and the Python
# package with its dev extra. constraints.txt pins torch to the CPU wheel.
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v chromium >/dev/null 2>&1; then
  sudo_cmd=""
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq chromium
fi

python3 -m pip install -c constraints.txt -e ".[dev]"
