# call 2: Chromium's first chunk; cera native at depth 512 on the three clones
bash scripts/h200/device.sh chunk
DEPTH=512 bash scripts/h200/device.sh native .h200/hdrs/llama8b.hdr .h200/hdrs/qwen7b.hdr .h200/hdrs/mistral7b.hdr
tail -3 /tmp/lc/cuda.log /tmp/lc/vk.log 2>/dev/null
