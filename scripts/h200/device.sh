#!/usr/bin/env bash
# On the H200 machine, from the project's root, with the prepared .h200/ beside it (README.md):
#   bash scripts/h200/device.sh chunk                 take the carried .h200/chr? chunk(s) into /opt/chr.tar.xz and
#                                                     .h200/smol? (the real SmolLM2) into /tmp/smolparts, once each
#   bash scripts/h200/device.sh prep                  loaders, wheels, this project; unpack Chromium once
#                                                     its chunks are all there
#   bash scripts/h200/device.sh lcpp                  build llama.cpp's llama-bench for CUDA and Vulkan (~6 min;
#                                                     `setsid ... lcpp &` lets it build while later calls run)
#   bash scripts/h200/device.sh bench X.hdr [Y.hdr]   shape clones of the headers; then, on each:
#                                                     cera native bench and decode profile, cera in Chromium
#                                                     (dist/web), llama.cpp CUDA and Vulkan llama-bench if built
#   bash scripts/h200/device.sh native X.hdr [...]    only the native bench and profile (another tree: run it
#                                                     from that tree, with TAG=name to keep its files apart)
#   bash scripts/h200/device.sh browser X.hdr [...]   only cera in Chromium (dist/web), once prep unpacked it
#                                                     (CHROME_FLAGS=... adds flags, TAG=-name keeps its files apart)
#   bash scripts/h200/device.sh peers X.hdr [...]     only llama.cpp CUDA and Vulkan (waits for a background lcpp)
#   bash scripts/h200/device.sh sampling X [...]      greedy and sampled decode, natively and in Chromium: cera bench
#                                                     with each of SAMPLINGS below (TAG -greedy, -topk40, -chain,
#                                                     -topk0); X a header (its clone) or `smollm2` (the real model,
#                                                     carried in .h200/smol? chunks). BEFORE=DIR also times DIR's
#                                                     tree (`generate --chat -n 256`, the form older trees have);
#                                                     HOSTS=native or HOSTS=browser runs one host only,
#                                                     SETTINGS="greedy chain" some of the settings
#   bash scripts/h200/device.sh tests FILE [...]      the GPU tests of these files (tests/test_kernels_*.py, ...) on
#                                                     the H200's own adapter, after prep (pytest from .h200/pyt);
#                                                     NVIDIA compiles each pipeline in ~1 s: a file or two a call
# CERA_FLAGS="--int8" measures cera (native and page) with those opt-ins (cera.gpu.numerics): set TAG too;
# CERA_FLAGS="--cache-type-k f32 --cache-type-v f32" TAG=-f32kv, its KV cache in f32 (f16 by default).
# DEPTH=4096: decode measured after that many tokens (cera's bench prompt, llama-bench's -d beside 512),
# native and peers; the table's decode column is at that depth (prefill is then cera's DEPTH-token prompt).
# Figures land in $OUT (JSON per engine and model, profiles as text) and a table is printed.
set -u
R=$(pwd)
H=${H200:-.h200}
FILL=${FILL:-}                     # FILL=random: clones of random bytes (shape_clone.py --fill)
TAG=${TAG:-${FILL:+-$FILL}}
FLAGS=${CERA_FLAGS:-}              # e.g. --int8: cera's opt-ins, native and in the page
DEPTH=${DEPTH:-512}                # the KV depth decode is measured at
CLONES=/tmp/clones${FILL:+-$FILL}
export XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1
ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f $ICD ] && export VK_DRIVER_FILES=$ICD VK_ICD_FILENAMES=$ICD
HERE=$(cd "$(dirname "$0")" && pwd)
phase=$1; shift
# the sampling phase's settings: the issue's table (greedy; top-k; the full chain; the whole vocabulary),
# and the cost of a JSON schema (a string of 600+ characters: every step masked) greedy and sampled
declare -A SAMPLINGS=(
  [greedy]=""
  [topk40]="--temperature 0.7 --top-k 40 --seed 1"
  [chain]="--temperature 0.7 --top-k 40 --top-p 0.9 --min-p 0.05 --repeat-penalty 1.1 --seed 1"
  [topk0]="--temperature 0.7 --top-k 0 --seed 1"
  [json]="--json-schema scripts/h200/long_json.json"                                    # constrained, greedy
  [topk40json]="--temperature 0.7 --top-k 40 --seed 1 --json-schema scripts/h200/long_json.json"   # and sampled
)
SMOLLM2_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

clones() {   # expand each header into $CLONES/NAME.gguf once (smollm2: the real model, from its chunks); print the names
  mkdir -p $CLONES
  for h in "$@"; do n=$(basename "$h" .hdr)
    if [ "$h" = smollm2 ]; then
      [ -s $CLONES/smollm2.gguf ] || cat /tmp/smolparts/smol? > $CLONES/smollm2.gguf
      [ "$(sha256sum $CLONES/smollm2.gguf | cut -d' ' -f1)" = $SMOLLM2_SHA ] || { echo "smollm2 chunks: bad sha256" >&2; continue; }
    else
      [ -s $CLONES/$n.gguf ] || python3 scripts/shape_clone.py expand "$h" $CLONES/$n.gguf --fill ${FILL:-constant} >/dev/null
    fi
    echo $n
  done
}

sampled() {  # cera bench (native, then in Chromium) with each setting of SAMPLINGS; BEFORE: DIR's tree too
  local n=$1 s json hosts=${HOSTS:-native browser}
  for s in ${SETTINGS:-greedy topk40 chain topk0}; do
    [[ $hosts == *native* ]] &&
      python3 -m cera bench -m $CLONES/$n.gguf --json ${SAMPLINGS[$s]} > $OUT/cera-native-$s-$n.json 2>/tmp/cera-native-$s-$n.err
    json=$(python3 -c "import sys, json; from cera.cli import parser; a = parser().parse_args(['bench', *sys.argv[1:]]);
print(json.dumps({k: getattr(a, k) for k in ('temperature', 'top_k', 'top_p', 'min_p', 'repeat_penalty', 'seed')}))" ${SAMPLINGS[$s]})
    [[ $hosts == *browser* ]] && TAG=-$s SAMPLING="$json" browser $n
    if [ -n "${BEFORE:-}" ] && [[ $hosts == *native* ]]; then
      for tree in /tmp/before ""; do   # the same 256-token chat reply from the older tree, then this one
        PYTHONPATH=$tree python3 -m cera generate -m $CLONES/$n.gguf --chat -p "Write a story about a dragon." -n 256 \
          --json ${SAMPLINGS[$s]} > $OUT/generate-${tree:+before-}$s-$n.json 2>/dev/null
      done
    fi
  done
}

native() {   # cera native: bench (512-token prompt, 128 tokens), the decode profile at KV 513, then
             # the 512-token prefill's (in the same file: the machine returns at most 8 files a call)
  local n=$1
  python3 -m cera bench -m $CLONES/$n.gguf --json --prompt-tokens $DEPTH --ctx $((DEPTH < 1792 ? 2048 : DEPTH + 256)) \
    $FLAGS > $OUT/cera-native$TAG-$n.json 2>/tmp/cera-native$TAG-$n.err
  python3 scripts/profile_decode.py $CLONES/$n.gguf --pos $DEPTH --top 12 $FLAGS > $OUT/profile$TAG-$n.txt 2>&1
  python3 scripts/profile_decode.py $CLONES/$n.gguf --prefill 512 --top 12 $FLAGS >> $OUT/profile$TAG-$n.txt 2>&1
  python3 -m cera plan -m $CLONES/$n.gguf --json --positions 512 $FLAGS > /tmp/plan$TAG-$n.json 2>/dev/null &&
    python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['totals']; print(json.dumps(t))" /tmp/plan$TAG-$n.json \
    > $OUT/plan$TAG-$n.json
}

browser() {  # cera in Chromium: the page served from dist/web, driven by browser_bench.py
  local n=$1 C=/opt/chr/chromium/chromium
  local flags="--headless=new --enable-unsafe-webgpu --ignore-gpu-blocklist --disable-gpu-sandbox --enable-features=Vulkan --use-angle=vulkan --disable-vulkan-surface --enable-logging=stderr ${CHROME_FLAGS:-}"
  [ -f dist/web/index.html ] && [ -x $C ] || { echo "no dist/web or no Chromium: browser bench of $n skipped"; return; }
  ln -sf $CLONES/$n.gguf dist/web/$n.gguf
  INT8=$([[ " $FLAGS " == *" --int8 "* ]] && echo 1) LD_LIBRARY_PATH=/opt/chr/lib:/opt/chr/chromium timeout 500 \
    python3 "$HERE/browser_bench.py" $C http://127.0.0.1:8765/index.html http://127.0.0.1:8765/$n.gguf $flags \
    > $OUT/cera-browser${TAG:-}-$n.json 2>/tmp/cera-browser-$n.err
}

peers() {    # llama.cpp CUDA and Vulkan llama-bench, once a background `lcpp` build is done (or none runs)
  local n=$1
  for i in $(seq 60); do [ -e /tmp/lc/done ] || [ ! -d /tmp/lc ] && break; sleep 10; done
  for b in cuda vk; do
    L=/tmp/lc/llama.cpp/build-$b/bin/llama-bench
    [ -x $L ] && $L -m $CLONES/$n.gguf -p 512 -n 128 -d $(printf "0\n512\n$DEPTH" | sort -nu | paste -sd,) -fa 1 -r 3 \
      -o json > $OUT/llamacpp-$b-$n.json 2>/dev/null
  done
}

serve() {    # dist/web on 127.0.0.1:8765 in the background; its pid in SRV
  mkdir -p dist/web
  (cd dist/web && exec python3 -m http.server 8765 --bind 127.0.0.1 >/tmp/http.log 2>&1) & SRV=$!
}

case $phase in
chunk)   # each chunk taken once, whatever earlier calls left in $H: Chromium's appended, SmolLM2's kept in /tmp
  mkdir -p /opt /tmp/smolparts
  for c in $H/chr? $H/smol?; do
    [ -f "$c" ] || continue
    sum=$(sha256sum "$c" | cut -c1-16)
    grep -qx "$sum" /opt/chunks.done 2>/dev/null && continue
    case $(basename "$c") in chr?) cat "$c" >> /opt/chr.tar.xz ;; *) cp "$c" /tmp/smolparts/ ;; esac
    echo "$sum" >> /opt/chunks.done && echo "took $c"
  done
  ls -la /opt/chr.tar.xz /tmp/smolparts
  ;;
prep)
  for f in $H/gl/*.deb; do [ -e "$f" ] && dpkg -x "$f" /; done; ldconfig
  mkdir -p /opt/vk && for f in $H/vk/*.deb; do [ -e "$f" ] && dpkg -x "$f" /opt/vk; done
  [ -s $H/lcpp/llama.cpp.tgz ] && mkdir -p /opt/lcpp && cp $H/lcpp/llama.cpp.tgz /opt/lcpp/
  python3 -m pip install -q --no-index --no-deps $H/whl/*.whl 2>&1 | tail -1
  python3 -m pip install -q --no-deps --no-build-isolation . 2>&1 | tail -1
  python3 -c "from cera.native import NativeDevice; d = NativeDevice(); print(d.adapter_name, sorted(d.features))"
  if [ -s /opt/chr.tar.xz ] && [ ! -x /opt/chr/chromium/chromium ]; then
    if [ "$(sha256sum /opt/chr.tar.xz | cut -d' ' -f1)" = "$(cat $H/chr.sha256)" ]; then
      tar xJf /opt/chr.tar.xz -C /opt && cp -r /opt/chr/root/. / && echo "chromium unpacked"
    else
      echo "chromium chunks incomplete: $(stat -c %s /opt/chr.tar.xz) bytes"
    fi
  fi
  ;;
lcpp)
  mkdir -p /tmp/lc && cd /tmp/lc && tar xzf /opt/lcpp/llama.cpp.tgz && cd llama.cpp
  common="-DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release"
  (cmake -B build-cuda -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 $common >/tmp/lc/cuda.log 2>&1 &&
   cmake --build build-cuda -j11 --target llama-bench >>/tmp/lc/cuda.log 2>&1; echo "cuda rc=$?") &
  (export PATH=/opt/vk/usr/bin:$PATH LD_LIBRARY_PATH=/opt/vk/usr/lib/x86_64-linux-gnu
   cmake -B build-vk -DGGML_VULKAN=ON $common -DVulkan_INCLUDE_DIR=/opt/vk/usr/include \
     -DVulkan_LIBRARY=/usr/lib/x86_64-linux-gnu/libvulkan.so.1 -DVulkan_GLSLC_EXECUTABLE=/opt/vk/usr/bin/glslc >/tmp/lc/vk.log 2>&1 &&
   cmake --build build-vk -j5 --target llama-bench >>/tmp/lc/vk.log 2>&1; echo "vulkan rc=$?") &
  wait
  touch /tmp/lc/done
  ;;
native)
  python3 -m pip install -q --no-deps --no-build-isolation . 2>&1 | tail -1     # this tree's code
  for n in $(clones "$@"); do native $n; done
  python3 "$HERE/table.py" "$OUT" $(clones "$@")
  ;;
browser)
  names=$(clones "$@")
  serve
  for n in $names; do browser $n; done
  kill $SRV
  python3 "$HERE/table.py" "$OUT" $names
  ;;
bench)
  python3 -m pip install -q --no-deps --no-build-isolation . 2>&1 | tail -1     # this tree's code
  names=$(clones "$@")
  serve
  for n in $names; do
    native $n
    browser $n
    peers $n
  done
  kill $SRV
  python3 "$HERE/table.py" "$OUT" $names
  ;;
tests)
  python3 -m pip install -q --no-index --no-deps $H/pyt/*.whl 2>&1 | tail -1
  python3 -m pip install -q --no-deps --no-build-isolation . 2>&1 | tail -1     # this tree's code
  name=$(for f in "$@"; do basename "$f" .py; done | paste -sd-)
  timeout ${TESTS_TIMEOUT:-540} python3 -m pytest -p no:cacheprovider -q -rfE "$@" > $OUT/pytest-h200-$name.txt 2>&1
  echo "pytest rc=$? (124: stopped at the time limit)"; tail -3 $OUT/pytest-h200-$name.txt
  ;;
sampling)
  python3 -m pip install -q --no-deps --no-build-isolation . 2>&1 | tail -1     # this tree's code
  if [ -n "${BEFORE:-}" ]; then
    python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/before "$BEFORE" 2>&1 | tail -3
    PYTHONPATH=/tmp/before python3 -c "import cera; print('BEFORE tree:', cera.__file__)"
  fi
  names=$(clones "$@")
  serve
  for n in $names; do sampled $n; done
  kill $SRV
  python3 "$HERE/table.py" "$OUT" $names
  ;;
peers)
  names=$(clones "$@")
  for n in $names; do peers $n; done
  python3 "$HERE/table.py" "$OUT" $names
  ;;
*)
  echo "unknown phase $phase"; exit 2
  ;;
esac
