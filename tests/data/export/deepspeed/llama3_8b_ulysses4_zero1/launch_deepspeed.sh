#!/usr/bin/env bash
# Written by parasol export --to deepspeed: llama3-8b on dgx-h100, 16 GPUs (2 x 8).
# Plan: tp 1, pp 1, Ulysses sequence parallel 4, dp 4, ZeRO 1, micro batch 1, global batch 16, recompute none, offload none.
# Checked against DeepSpeed 0.19.6 (deepspeedai/DeepSpeed edaa722), Megatron-DeepSpeed (deepspeedai/Megatron-DeepSpeed 4efb479).
# parasol-export: model=llama3-8b cluster=dgx-h100 gpus=16
# Note: DeepSpeed ZeRO-1/2 all-gather the updated parameters after the optimizer step without overlapping it.
set -euo pipefail
# This folder's files (hostfile, ds_config.json), wherever the script runs from.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# Megatron-DeepSpeed (deepspeedai/Megatron-DeepSpeed): run from its checkout; give the data and
# tokenizer arguments after the script ("$@").
MODEL_ARGS=(
  --num-layers 32
  --hidden-size 4096
  --ffn-hidden-size 14336
  --num-attention-heads 32
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
  --tensor-model-parallel-size 1
  --pipeline-model-parallel-size 1
  --micro-batch-size 1
  --global-batch-size 16
  --ds-sequence-parallel-size 4
  --bf16
)
DEEPSPEED_ARGS=(
  --deepspeed
  --deepspeed_config "$HERE/ds_config.json"
  --zero-stage 1
  --no-pipeline-parallel
)
deepspeed --hostfile="$HERE/hostfile" --num_nodes 2 --num_gpus 8 \
  pretrain_gpt.py "${MODEL_ARGS[@]}" "${PARALLEL_ARGS[@]}" "${DEEPSPEED_ARGS[@]}" "$@"
