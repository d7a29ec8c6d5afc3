#!/usr/bin/env bash
# Installs the C compiler the tests need: the CPU backend builds its fused kernels (qlower/backends/cpu/_native.c,
# gcc with OpenMP) and a test compiles the Ethos-U C header. Without it those tests fail; they never skip.
set -euo pipefail
if command -v gcc >/dev/null 2>&1 && echo 'int main(void){return 0;}' | gcc -fopenmp -x c - -o /dev/null 2>/dev/null; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup_compiler: apt-get install gcc libc6-dev"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq gcc libc6-dev >/dev/null
