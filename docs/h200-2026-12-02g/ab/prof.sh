# bash .varA/prof.sh native|browser NAME...: the wall marginal profile natively or in the page (H200 machine)
set -u
ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1 VK_DRIVER_FILES=$ICD VK_ICD_FILENAMES=$ICD
mode=$1; shift
if [ $mode = native ]; then
  for n in "$@"; do echo "native $n $(python3 .varA/wallprof.py /tmp/clones/$n.gguf 2>/tmp/wp-$n.err | tail -1)"; tail -2 /tmp/wp-$n.err; done
else
  (cd dist/web && exec python3 -m http.server 8765 --bind 127.0.0.1 >/tmp/http.log 2>&1) & SRV=$!
  C=/opt/chr/chromium/chromium
  flags="--headless=new --enable-unsafe-webgpu --ignore-gpu-blocklist --disable-gpu-sandbox --enable-features=Vulkan --use-angle=vulkan --disable-vulkan-surface --enable-logging=stderr ${CHROME_FLAGS:-}"
  for n in "$@"; do
    ln -sf /tmp/clones/$n.gguf dist/web/$n.gguf
    LD_LIBRARY_PATH=/opt/chr/lib:/opt/chr/chromium timeout 300 python3 .varA/browser_prof.py $C http://127.0.0.1:8765/index.html http://127.0.0.1:8765/$n.gguf $flags > $OUT/prof-browser${TAG:-}-$n.json 2>/tmp/bp-$n.err
    echo "browser${TAG:-} $n $(python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('prof'))" $OUT/prof-browser${TAG:-}-$n.json)"
  done
  kill $SRV
fi
