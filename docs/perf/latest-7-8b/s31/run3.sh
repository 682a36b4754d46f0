# call 3: Chromium's second chunk; cera native at depth 4096, llama.cpp at 0, 512 and 4096
bash scripts/h200/device.sh chunk
DEPTH=4096 bash scripts/h200/device.sh native .h200/hdrs/llama8b.hdr .h200/hdrs/qwen7b.hdr .h200/hdrs/mistral7b.hdr
DEPTH=4096 bash scripts/h200/device.sh peers .h200/hdrs/llama8b.hdr .h200/hdrs/qwen7b.hdr .h200/hdrs/mistral7b.hdr
