#!/bin/bash
# Megatron-LM launch written by parasol export.
# gpt3-175b on 1024 GPUs of dgx-a100-80g: tp 8, pp 8, dp 16, cp 1, ep 1.
# Flags checked against Megatron-Core 0.20.0 (NVIDIA/Megatron-LM d98e8a64ddf3, 2026-08-22).
# parasol-export: model=gpt3-175b cluster=dgx-a100-80g gpus=1024
# Run on every node with NODE_RANK and MASTER_ADDR set, from a Megatron-LM checkout
# (MEGATRON_LM, default: the current directory).
set -euo pipefail

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=8
NNODES=128
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-29500}

MODEL_ARGS=(
    --num-layers 96
    --hidden-size 12288
    --ffn-hidden-size 49152
    --num-attention-heads 96
    --kv-channels 128
    --normalization LayerNorm
    --position-embedding-type learned_absolute
    --max-position-embeddings 2048
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 1536
    --seq-length 2048
    --bf16
    --attention-backend flash
    --mock-data
    --tokenizer-type NullTokenizer
    --vocab-size 50257
    --train-iters 100
    --lr 1.0e-4
    --log-interval 1
    --log-throughput
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 8
    --pipeline-model-parallel-size 8
    --sequence-parallel
    --context-parallel-size 1
    --expert-model-parallel-size 1
    --expert-tensor-parallel-size 8
    --overlap-grad-reduce
    --cross-entropy-loss-fusion
)

cd "${MEGATRON_LM:-.}"
torchrun --nproc_per_node "$GPUS_PER_NODE" --nnodes "$NNODES" --node_rank "$NODE_RANK" \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
    pretrain_gpt.py \
    "${MODEL_ARGS[@]}" \
    "${TRAINING_ARGS[@]}" \
    "${MODEL_PARALLEL_ARGS[@]}"
