source .h200/ab/lib.sh
for v in sg3 sg2 sg3 sg2; do use $v; prof llama8b 4096 V=$v; done
grep -E "^==|GPU time of the step|attention" $OUT/prof-*.txt
# then, as a command of its own: source .h200/ab/lib.sh; for v in sg3 loop; do use $v; bench llama8b 4096 V=$v; done
