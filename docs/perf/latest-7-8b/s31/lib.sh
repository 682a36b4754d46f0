# helpers for the device calls (sourced from a run script, on the device, in the repo root)
set -u
export XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1
ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f $ICD ] && export VK_DRIVER_FILES=$ICD VK_ICD_FILENAMES=$ICD
C=/tmp/clones
setup() {   # loaders and wheels once a machine; this tree's code every call
  if [ ! -e /tmp/prepped ]; then
    for f in .h200/gl/*.deb; do dpkg -x "$f" /; done; ldconfig
    python3 -m pip install -q --no-index --no-deps .h200/whl/*.whl 2>&1 | tail -1
    touch /tmp/prepped
  fi
  python3 -m pip install -q --no-deps --no-build-isolation . 2>&1 | tail -1
}
clone() { mkdir -p $C; for n in "$@"; do [ -s $C/$n.gguf ] || python3 scripts/shape_clone.py expand .h200/hdrs/$n.hdr $C/$n.gguf --fill constant >/dev/null; done; }
prof() {    # NAME POS [ENV=V ...]: decode profile into $OUT/prof-NAME.txt
  local n=$1 pos=$2; shift 2
  echo "== $n pos $pos $* $(date +%T)" >> $OUT/prof-$n.txt
  env "$@" python3 scripts/profile_decode.py $C/$n.gguf --pos $pos --top 24 --ctx $((pos < 1792 ? 2048 : pos + 256)) >> $OUT/prof-$n.txt 2>&1
}
bench() {   # NAME DEPTH [ENV=V ...]: cera bench, one JSON line into $OUT/bench.txt
  local n=$1 d=$2; shift 2
  echo "$* $n d$d $(env "$@" python3 -m cera bench -m $C/$n.gguf --json --prompt-tokens $d --ctx $((d < 1792 ? 2048 : d + 256)) 2>&1 | tail -1)" >> $OUT/bench.txt
}
lcpp_start() {   # llama.cpp CUDA's llama-bench, built in the background (~5 min)
  [ -d /tmp/lc ] && return
  mkdir -p /tmp/lc && tar xzf .h200/lcpp/llama.cpp.tgz -C /tmp/lc
  (cd /tmp/lc/llama.cpp && cmake -B build-cuda -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
     -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release >/tmp/lc/cuda.log 2>&1 &&
   cmake --build build-cuda -j14 --target llama-bench >>/tmp/lc/cuda.log 2>&1; echo "cuda rc=$?" >> /tmp/lc/cuda.log; touch /tmp/lc/done) \
   </dev/null >/dev/null 2>&1 &
}
peer() {    # NAME DEPTHS: llama-bench CUDA once built
  local n=$1 d=$2
  for i in $(seq 60); do [ -e /tmp/lc/done ] && break; sleep 5; done
  /tmp/lc/llama.cpp/build-cuda/bin/llama-bench -m $C/$n.gguf -p 512 -n 128 -d $d -fa 1 -r 3 -o json > $OUT/llamacpp-cuda-$n-$(echo $d | tr , _).json 2>/dev/null
  tail -1 /tmp/lc/cuda.log
}
use() {     # use VARIANT: shaders/attention.wgsl <- .h200/ab/attention_VARIANT.wgsl, installed
  cp .h200/ab/attention_$1.wgsl shaders/attention.wgsl
  python3 -m pip install -q --no-deps --no-build-isolation . 2>&1 | tail -1
}
