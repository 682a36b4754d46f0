# call 5 (a fresh machine): the value pass's subgroup butterfly (sg), and the scores' too (sg2), against loop
source .h200/ab/lib.sh
setup
clone llama8b
python3 -m pip install -q --no-index --no-deps .h200/pyt/*.whl 2>&1 | tail -1
use sg2
timeout 100 python3 -m pytest -p no:cacheprovider -q tests/test_kernels_layers.py -k "value_pass_reduction" > $OUT/pytest-h100.txt 2>&1; tail -2 $OUT/pytest-h100.txt
for v in sg2 loop sg sg2 loop sg; do use $v; prof llama8b 4096 V=$v; done
use sg2; prof llama8b 4096 V=sg2 CERA_ATT_LANES=2
grep -E "^==|GPU time of the step|attention" $OUT/prof-*.txt
for v in sg2 loop; do use $v; bench llama8b 4096 V=$v; done
cut -c1-300 $OUT/bench.txt
