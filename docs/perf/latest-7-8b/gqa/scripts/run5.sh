source .h200/lib.sh
setup
python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/before .h200/before 2>&1 | tail -1
clone llama8b qwen15 smollm2
for m in "smollm2 512" "qwen15 512" "llama8b 4096"; do
  echo "== before" >> $OUT/prof-${m% *}.txt
  PYTHONPATH=/tmp/before prof $m
  prof $m
done
grep -E "^==|GPU time of the step|attention" $OUT/prof-*.txt | grep -v "us  attention"
