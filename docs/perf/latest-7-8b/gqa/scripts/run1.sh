source .h200/lib.sh
setup
clone llama8b qwen15
nvidia-smi --query-gpu=name --format=csv,noheader
prof llama8b 4096 CERA_ATT_HPW=1 CERA_NOCOMBREC=1
prof llama8b 4096 CERA_ATT_PREFETCH=1
prof qwen15 512 CERA_ATT_HPW=1
prof qwen15 512 CERA_ATT_PREFETCH=1
prof llama8b 4096
clone qwen7b
prof qwen7b 4096 CERA_ATT_HPW=1 CERA_NOCOMBREC=1
prof qwen7b 4096 CERA_ATT_BUDGET=32768 CERA_ATT_PREFETCH=1
