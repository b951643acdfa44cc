#!/usr/bin/env bash
# Written by parasol export --to deepspeed: llama3-70b on dgx-h100, 64 GPUs (8 x 8).
# Plan: tp 8, pp 1, dp 8, ZeRO 3, micro batch 1, global batch 128, recompute full, offload none.
# Checked against DeepSpeed 0.19.6 (deepspeedai/DeepSpeed edaa722), Megatron-DeepSpeed (deepspeedai/Megatron-DeepSpeed 4efb479).
# parasol-export: model=llama3-70b cluster=dgx-h100 gpus=64
set -euo pipefail
# This folder's files (hostfile, ds_config.json), wherever the script runs from.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# Megatron-DeepSpeed's sequence parallelism needs it on every rank: here for this node,
# through DS_ENV_FILE for the others.
export CUDA_DEVICE_MAX_CONNECTIONS=1
export DS_ENV_FILE="$HERE/.deepspeed_env"
# Megatron-DeepSpeed (deepspeedai/Megatron-DeepSpeed): run from its checkout; give the data and
# tokenizer arguments after the script ("$@").
MODEL_ARGS=(
  --num-layers 80
  --hidden-size 8192
  --ffn-hidden-size 28672
  --num-attention-heads 64
  --num-key-value-heads 8
  --seq-length 8192
  --max-position-embeddings 8192
  --vocab-size 128256
  --normalization rmsnorm
  --swiglu
  --use-rotary-position-embeddings
  --rotary-position-embeddings-theta 500000
  --untie-embeddings-and-output-weights
  --disable-bias-linear
  --attention-dropout 0
  --hidden-dropout 0
  --use-flash-attn-v2
)
PARALLEL_ARGS=(
  --tensor-model-parallel-size 8
  --pipeline-model-parallel-size 1
  --micro-batch-size 1
  --global-batch-size 128
  --sequence-parallel
  --bf16
)
DEEPSPEED_ARGS=(
  --deepspeed
  --deepspeed_config "$HERE/ds_config.json"
  --zero-stage 3
  --no-pipeline-parallel
  --deepspeed-activation-checkpointing
  --recompute-granularity full
  --recompute-method uniform
  --recompute-num-layers 1
)
deepspeed --hostfile="$HERE/hostfile" --num_nodes 8 --num_gpus 8 \
  pretrain_gpt.py "${MODEL_ARGS[@]}" "${PARALLEL_ARGS[@]}" "${DEEPSPEED_ARGS[@]}" "$@"
