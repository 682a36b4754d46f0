# call 4: Chromium's last chunk, unpacked; cera in the page on the three clones
bash scripts/h200/device.sh chunk
bash scripts/h200/device.sh prep
bash scripts/h200/device.sh browser .h200/hdrs/llama8b.hdr .h200/hdrs/qwen7b.hdr .h200/hdrs/mistral7b.hdr
