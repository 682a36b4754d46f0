#!/bin/bash
# Set up cera on a Debian/Ubuntu machine: a Vulkan driver (Mesa's lavapipe runs WebGPU on the
# CPU where there is no GPU), Chromium for the browser tests (never `playwright install`: the
# tests drive Debian's /usr/bin/chromium), Node.js/npm (the Pyodide runtime comes from npm), and
# the Python package with its native, test, serve and web extras. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
need=()
for pkg in mesa-vulkan-drivers libvulkan1 chromium; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
command -v npm >/dev/null 2>&1 || need+=(npm)
command -v node >/dev/null 2>&1 || need+=(nodejs)
if [ ${#need[@]} -gt 0 ]; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
python3 -m pip install -q -e '.[native,test,serve,web]'
# what the tests use, fetched now so the test run downloads nothing: the browser site's pinned
# parts (npm Pyodide, PyPI wheels) and the default model, SmolLM2 (98 MB)
python3 pyodide_build --fetch-only
python3 -c "from cera import catalogue; catalogue.fetch(catalogue.DEFAULT_MODEL)"
