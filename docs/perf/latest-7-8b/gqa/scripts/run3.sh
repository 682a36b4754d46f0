source .h200/lib.sh
setup
clone llama8b
prof llama8b 4096 CERA_ATT_SPLIT=128 CERA_ATT_BUDGET=32768 CERA_ATT_HR=1
prof llama8b 4096 CERA_ATT_SPLIT=32
prof llama8b 4096 CERA_ATT_SPLIT=128 CERA_ATT_BUDGET=32768 CERA_ATT_HR=1 CERA_ATT_HPW=1
prof llama8b 4096
grep -E "^==|GPU time of the step|attention" $OUT/prof-*.txt | grep -v "us  attention"
