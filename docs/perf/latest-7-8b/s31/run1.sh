# call 1: loaders, wheels, llama.cpp's build in the background; the attention A/B on the Llama clone at 4096
rm -f /opt/chr.tar.xz
bash scripts/h200/device.sh prep
setsid bash scripts/h200/device.sh lcpp > /tmp/lcpp.log 2>&1 < /dev/null &
source .h200/ab/lib.sh
touch /tmp/prepped
clone llama8b qwen7b mistral7b
ls -la $C
for v in loop tree loop tree; do use $v; prof llama8b 4096 V=$v; done
use loop; prof qwen7b 4096 V=loop; use tree; prof qwen7b 4096 V=tree; use loop
grep -E "^==|GPU time of the step|attention" $OUT/prof-*.txt
python3 scripts/profile_decode.py $C/llama8b.gguf --pos 4096 --top 24 --ctx 4352 --cache-type-k q8_0 --cache-type-v q8_0 > $OUT/prof-llama8b-q8.txt 2>&1
grep -E "GPU time of the step|attention" $OUT/prof-llama8b-q8.txt
