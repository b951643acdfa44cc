#!/bin/bash
# Megatron-LM launch written by parasol export.
# mixtral-8x7b on 64 GPUs of dgx-h100: tp 2, pp 4, dp 8, cp 1, ep 8.
# Flags checked against Megatron-Core 0.20.0 (NVIDIA/Megatron-LM d98e8a64ddf3, 2026-08-22).
# parasol-export: model=mixtral-8x7b cluster=dgx-h100 gpus=64
# Run on every node with NODE_RANK and MASTER_ADDR set, from a Megatron-LM checkout
# (MEGATRON_LM, default: the current directory).
set -euo pipefail

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=8
NNODES=8
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-29500}

MODEL_ARGS=(
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --kv-channels 128
    --swiglu
    --normalization RMSNorm
    --position-embedding-type rope
    --rotary-base 10000
    --max-position-embeddings 4096
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --num-experts 8
    --moe-router-topk 2
    --moe-ffn-hidden-size 14336
    --moe-grouped-gemm
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 256
    --seq-length 4096
    --bf16
    --attention-backend flash
    --recompute-granularity selective
    --recompute-modules core_attn moe_act
    --mock-data
    --tokenizer-type NullTokenizer
    --vocab-size 32000
    --train-iters 100
    --lr 1.0e-4
    --log-interval 1
    --log-throughput
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 2
    --pipeline-model-parallel-size 4
    --num-virtual-stages-per-pipeline-rank 2
    --sequence-parallel
    --context-parallel-size 1
    --expert-model-parallel-size 8
    --expert-tensor-parallel-size 1
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    --cross-entropy-loss-fusion
    --moe-token-dispatcher-type flex
    --moe-flex-dispatcher-backend deepep
)

cd "${MEGATRON_LM:-.}"
torchrun --nproc_per_node "$GPUS_PER_NODE" --nnodes "$NNODES" --node_rank "$NODE_RANK" \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
    pretrain_gpt.py \
    "${MODEL_ARGS[@]}" \
    "${TRAINING_ARGS[@]}" \
    "${MODEL_PARALLEL_ARGS[@]}"
