#!/bin/bash
# Megatron-LM launch written by parasol export.
# tiny on 8 GPUs of dgx-h100: tp 2, pp 2, dp 2, cp 1, ep 1.
# Flags checked against Megatron-Core 0.20.0 (NVIDIA/Megatron-LM d98e8a64ddf3, 2026-08-22).
# parasol-export: model=tiny cluster=dgx-h100 gpus=8
# Run on every node with NODE_RANK and MASTER_ADDR set, from a Megatron-LM checkout
# (MEGATRON_LM, default: the current directory).
set -euo pipefail

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=8
NNODES=1
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-29500}

MODEL_ARGS=(
    --num-layers 2
    --hidden-size 64
    --ffn-hidden-size 256
    --num-attention-heads 4
    --group-query-attention
    --num-query-groups 2
    --kv-channels 16
    --swiglu
    --normalization RMSNorm
    --position-embedding-type rope
    --rotary-base 10000
    --max-position-embeddings 64
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --attention-dropout 0.0
    --hidden-dropout 0.0
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 2
    --seq-length 64
    --bf16
    --attention-backend flash
    --recompute-granularity selective
    --recompute-modules core_attn
    --mock-data
    --tokenizer-type NullTokenizer
    --vocab-size 512
    --train-iters 100
    --lr 1.0e-4
    --log-interval 1
    --log-throughput
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 2
    --pipeline-model-parallel-size 2
    --sequence-parallel
    --context-parallel-size 1
    --expert-model-parallel-size 1
    --expert-tensor-parallel-size 2
    --overlap-grad-reduce
)

cd "${MEGATRON_LM:-.}"
torchrun --nproc_per_node "$GPUS_PER_NODE" --nnodes "$NNODES" --node_rank "$NODE_RANK" \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
    pretrain_gpt.py \
    "${MODEL_ARGS[@]}" \
    "${TRAINING_ARGS[@]}" \
    "${MODEL_PARALLEL_ARGS[@]}"
