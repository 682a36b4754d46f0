#!/usr/bin/env bash
# Prepare, on the development machine, what the H200 machine needs and cannot download:
# Vulkan/GL loader debs, Python 3.12 wheels (wgpu, gguf, ..., pytest), llama.cpp's source (from the
# llama-cpp-python sdist) with Vulkan headers and glslc for its Vulkan build, Chromium with its
# shared libraries and fonts split into chunks that fit one device call each, the static site
# (dist/web) and the shape-clone headers of the two catalogue models and of three 7-8B shapes.
#   bash scripts/h200/prepare.sh            (from the project's root, after scripts/setup.sh)
# Writes .h200/ (git-ignored through .git/info/exclude); README.md beside this says what next.
set -euo pipefail
H=.h200
PY=${PYTHON:-python3}
mkdir -p $H/gl $H/whl $H/vk $H/lcpp
exclude=$(git rev-parse --git-common-dir)/info/exclude
grep -qx '/.h200/' "$exclude" 2>/dev/null || echo '/.h200/' >> "$exclude"
APT="-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/h200-apt"
mkdir -p /tmp/h200-apt/partial
apt-get $APT update -qq
(cd $H/gl && apt-get $APT download -qq libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
(cd $H/vk && apt-get $APT download -qq glslc libshaderc1)
# newer Vulkan headers than bookworm's (llama.cpp's Vulkan backend needs >= 1.3.26x): trixie's
TRIXIE=/tmp/h200-trixie; mkdir -p $TRIXIE/lists/partial
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" > $TRIXIE/sources.list
T="-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=$TRIXIE/lists -oDir::Etc::SourceList=$TRIXIE/sources.list -oDir::Etc::SourceParts=/nonexistent"
apt-get $T update -qq && (cd $H/vk && apt-get $T download -qq libvulkan-dev spirv-headers)
$PY -m pip download -q -d $H/whl --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any \
  wgpu==0.32.0 gguf==0.19.0 cffi==2.1.1 pycparser rendercanvas sniffio llguidance==1.9.1
mkdir -p $H/pyt && $PY -m pip download -q -d $H/pyt --no-deps --only-binary=:all: --python-version 3.12 \
  --platform any pytest pluggy iniconfig packaging pygments       # for `device.sh tests`
if [ ! -s $H/lcpp/llama.cpp.tgz ]; then
  t=$(mktemp -d); $PY -m pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d $t
  tar xzf $t/llama_cpp_python-0.3.36.tar.gz -C $t
  tar czf $H/lcpp/llama.cpp.tgz -C $t/llama_cpp_python-0.3.36/vendor --exclude=llama.cpp/models \
    --exclude=llama.cpp/docs --exclude=llama.cpp/benches --exclude=llama.cpp/media llama.cpp
  rm -rf $t
fi
if [ ! -s $H/chra ]; then      # Chromium as installed here (scripts/setup.sh), with its libraries
  t=$(mktemp -d); mkdir -p $t/chr/lib $t/chr/chromium
  ldd /usr/lib/chromium/chromium | awk '/=>/ {print $3}' \
    | grep -v -E "/(libc|libm|libdl|libpthread|librt|ld-linux-x86-64|libresolv)\.so" | xargs cp -L -t $t/chr/lib
  (cd /usr/lib/chromium && cp -r chromium chrome_crashpad_handler chrome_100_percent.pak chrome_200_percent.pak \
    icudtl.dat libEGL.so libGLESv2.so libvk_swiftshader.so vk_swiftshader_icd.json libvulkan.so.1 locales \
    resources.pak snapshot_blob.bin v8_context_snapshot.bin $t/chr/chromium/)
  mkdir -p $t/chr/root && cp -r --parents /etc/fonts /usr/share/fonts/truetype/dejavu $t/chr/root/
  tar cf - -C $t chr | xz -T0 -6 > $t/chr.tar.xz
  split -b 44m -a 1 $t/chr.tar.xz $H/chr
  sha256sum $t/chr.tar.xz | cut -d' ' -f1 > $H/chr.sha256
  rm -rf $t
fi
if [ ! -s $H/smola ]; then    # the real SmolLM2 (98 MB), in chunks that fit a device call each (device.sh sampling)
  split -b 44m -a 1 "$($PY -c "from cera import catalogue; print(catalogue.fetch('smollm2-135m-instruct'))")" $H/smol
fi
[ -f dist/web/index.html ] || $PY pyodide_build
for m in smollm2-135m-instruct:smollm2 qwen2.5-coder-1.5b-instruct:qwen15; do   # catalogue name:header name
  [ -s $H/${m#*:}.hdr ] || $PY scripts/shape_clone.py header "$($PY -c "from cera import catalogue; print(catalogue.fetch('${m%%:*}'))")" $H/${m#*:}.hdr
done
for m in llama-3.1-8b:llama8b qwen2.5-7b:qwen7b mistral-7b:mistral7b; do   # the 7-8B shapes (synthesized headers)
  [ -s $H/${m#*:}.hdr ] || $PY scripts/shape_clone.py synth ${m%%:*} $H/${m#*:}.hdr
done
du -sh $H/* dist/web
echo "next: scripts/h200/README.md, step 2"
