source .h200/lib.sh
setup
clone llama8b mistral7b qwen7b
bench llama8b 4096 CERA_ATT_HPW=1 CERA_NOCOMBREC=1
bench llama8b 4096
bench llama8b 512 CERA_ATT_HPW=1 CERA_NOCOMBREC=1
bench llama8b 512
bench mistral7b 512
bench qwen7b 4096
bench qwen7b 4096 CERA_ATT_HPW=1 CERA_NOCOMBREC=1
bench mistral7b 512 CERA_ATT_HPW=1 CERA_NOCOMBREC=1
cut -c1-400 $OUT/bench.txt
