#!/usr/bin/env bash
# Installs what the VGF backend needs to run VGF files for real, then checks that it does.
#   Debian: libvulkan1 (the Vulkan loader), mesa-vulkan-drivers (lavapipe, a CPU Vulkan 1.3 driver)
#   PyPI (into the venv): the ML SDK model converter, scenario runner, VGF library and the
#   ML emulation layer for Vulkan (VK_ARM_tensors / VK_ARM_data_graph on any Vulkan 1.3 device).
# Idempotent: apt-get runs only when a package is missing; pip leaves satisfied pins alone.
# Usage: scripts/setup_vulkan.sh [--no-check]     (VENV=path overrides the venv, default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
DEBIAN_PACKAGES=(libvulkan1 mesa-vulkan-drivers)
PYPI_PACKAGES=(
  ai-ml-sdk-model-converter==0.11.0   # 0.10.0's binary does not run on Debian 12's glibc
  ai-ml-sdk-scenario-runner==0.11.0
  ai-ml-sdk-vgf-library==0.11.0
  ai-ml-emulation-layer-for-vulkan==0.11.0
)

missing=()
for pkg in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "setup_vulkan: apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup_vulkan: no virtual environment at $VENV (create it first, e.g. make's .venv)" >&2
  exit 1
fi
# Installs nothing when every pin is already satisfied.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PYPI_PACKAGES[@]}"

if [ "${1:-}" != "--no-check" ]; then
  # Runs a one-op VGF on Vulkan through the whole chain and prints the device (or the exact failure).
  TOSA_MODEL_NO_BACKTRACE=1 "$VENV/bin/python" - <<'EOF'
import sys

from qlower.backends.vgf.backend import vulkan_status

ok, detail = vulkan_status()
print(f"setup_vulkan: VGF runs on Vulkan: {detail}" if ok else f"setup_vulkan: VGF can't run on Vulkan: {detail}")
sys.exit(0 if ok else 1)
EOF
fi
