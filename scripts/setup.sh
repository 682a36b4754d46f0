#!/bin/bash
# Set up cera on a Debian/Ubuntu machine: a Vulkan driver (Mesa's lavapipe runs WebGPU on the
# CPU where there is no GPU), Chromium for the browser tests, and the Python package with its
# native and test extras. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
if ! dpkg -s mesa-vulkan-drivers libvulkan1 chromium >/dev/null 2>&1; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mesa-vulkan-drivers libvulkan1 chromium >/dev/null
fi
python3 -m pip install -q -e '.[native,test]'
