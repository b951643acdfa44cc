#!/usr/bin/env bash
# Written by parasol export --to deepspeed: tiny on dgx-h100, 8 GPUs (1 x 8).
# Plan: tp 2, pp 2, dp 2, ZeRO 1, micro batch 1, global batch 2, recompute none, offload none.
# Checked against DeepSpeed 0.19.6 (deepspeedai/DeepSpeed edaa722), Megatron-DeepSpeed (deepspeedai/Megatron-DeepSpeed 4efb479).
# parasol-export: model=tiny cluster=dgx-h100 gpus=8
# Note: DeepSpeed ZeRO-1/2 all-gather the updated parameters after the optimizer step without overlapping it.
set -euo pipefail
# This folder's files (hostfile, ds_config.json), wherever the script runs from.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# Megatron-DeepSpeed (deepspeedai/Megatron-DeepSpeed): run from its checkout; give the data and
# tokenizer arguments after the script ("$@").
MODEL_ARGS=(
  --num-layers 2
  --hidden-size 64
  --ffn-hidden-size 256
  --num-attention-heads 4
  --num-key-value-heads 2
  --seq-length 64
  --max-position-embeddings 64
  --vocab-size 512
  --normalization rmsnorm
  --swiglu
  --use-rotary-position-embeddings
  --rotary-position-embeddings-theta 10000
  --untie-embeddings-and-output-weights
  --disable-bias-linear
  --attention-dropout 0
  --hidden-dropout 0
  --use-flash-attn-v2
)
PARALLEL_ARGS=(
  --tensor-model-parallel-size 2
  --pipeline-model-parallel-size 2
  --micro-batch-size 1
  --global-batch-size 2
  --bf16
)
DEEPSPEED_ARGS=(
  --deepspeed
  --deepspeed_config "$HERE/ds_config.json"
  --zero-stage 1
)
deepspeed --hostfile="$HERE/hostfile" --num_nodes 1 --num_gpus 8 \
  pretrain_gpt.py "${MODEL_ARGS[@]}" "${PARALLEL_ARGS[@]}" "${DEEPSPEED_ARGS[@]}" "$@"
