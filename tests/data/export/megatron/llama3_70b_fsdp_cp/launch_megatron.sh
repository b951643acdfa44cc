#!/bin/bash
# Megatron-LM launch written by parasol export.
# llama3-70b on 64 GPUs of dgx-h100: tp 4, pp 2, dp 4, cp 2, ep 1.
# Flags checked against Megatron-Core 0.20.0 (NVIDIA/Megatron-LM d98e8a64ddf3, 2026-08-22).
# parasol-export: model=llama3-70b cluster=dgx-h100 gpus=64
# Run on every node with NODE_RANK and MASTER_ADDR set, from a Megatron-LM checkout
# (MEGATRON_LM, default: the current directory).
set -euo pipefail

unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron FSDP needs more than one

GPUS_PER_NODE=8
NNODES=8
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-29500}

MODEL_ARGS=(
    --num-layers 80
    --hidden-size 8192
    --ffn-hidden-size 28672
    --num-attention-heads 64
    --group-query-attention
    --num-query-groups 8
    --kv-channels 128
    --swiglu
    --normalization RMSNorm
    --position-embedding-type rope
    --rotary-base 500000
    --max-position-embeddings 16384
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --attention-dropout 0.0
    --hidden-dropout 0.0
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 64
    --seq-length 16384
    --bf16
    --fp8-format hybrid
    --attention-backend fused
    --recompute-granularity full
    --recompute-method block
    --recompute-num-layers 10
    --mock-data
    --tokenizer-type NullTokenizer
    --vocab-size 128256
    --train-iters 100
    --lr 1.0e-4
    --log-interval 1
    --log-throughput
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 4
    --pipeline-model-parallel-size 2
    --pipeline-model-parallel-layout 'Et*38|t*42L'
    --context-parallel-size 2
    --expert-model-parallel-size 1
    --expert-tensor-parallel-size 4
    --use-megatron-fsdp
    --data-parallel-sharding-strategy optim_grads_params
    --ckpt-format fsdp_dtensor
    --overlap-grad-reduce
    --overlap-param-gather
    --cross-entropy-loss-fusion
)

cd "${MEGATRON_LM:-.}"
torchrun --nproc_per_node "$GPUS_PER_NODE" --nnodes "$NNODES" --node_rank "$NODE_RANK" \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
    pretrain_gpt.py \
    "${MODEL_ARGS[@]}" \
    "${TRAINING_ARGS[@]}" \
    "${MODEL_PARALLEL_ARGS[@]}"
