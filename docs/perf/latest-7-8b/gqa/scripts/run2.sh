source .h200/lib.sh
setup
clone llama8b qwen15 qwen7b smollm2
prof qwen15 512
prof qwen15 512 CERA_ATT_HPW=1
prof smollm2 512 CERA_ATT_HPW=1
prof smollm2 512
prof llama8b 4096 CERA_ATT_BUDGET=32768
prof llama8b 4096 CERA_ATT_HPW=2
prof llama8b 4096
prof llama8b 4096 CERA_ATT_HPW=1 CERA_NOCOMBREC=1
prof llama8b 4096 CERA_ATT_HPW=1
prof qwen7b 4096 CERA_ATT_BUDGET=32768
prof qwen7b 4096
prof llama8b 512 CERA_ATT_HPW=1 CERA_NOCOMBREC=1
prof llama8b 512
grep -E "^==|GPU time of the step|attention|pipelined" $OUT/prof-*.txt
