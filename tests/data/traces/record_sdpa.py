#!/usr/bin/env python3
"""Records tests/data/traces/sdpa_cpu_bf16.json.gz: a PyTorch profiler (Kineto) trace of a
Llama-shaped attention step on the CPU, as a user would record one.

Llama 3's attention in miniature: grouped-query attention (8 query heads sharing 2 key/value
heads), head dim 64, a causal mask, bf16, through torch.nn.functional.scaled_dot_product_attention
forward and backward. Two profiled steps (ProfilerStep#1-2) after one warm-up step, with
record_shapes so that the import reads each op's input shapes and is_causal.

    python3 tests/data/traces/record_sdpa.py [OUT]    (needs torch from PyPI; CPU only)

tests/traces/kineto_import_test.cc and kineto_calibrate_test.cc read the bundled recording; ctest's
sdpa_trace_recording records one here and imports it (exit 77, skipped, where torch cannot be
imported).
"""
import gzip
import json
import os
import sys

try:
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile, schedule
except ImportError as e:  # pragma: no cover
    print(f"skipped: PyTorch cannot be imported here ({e})")
    sys.exit(77)

B, H, KV, S, D = 2, 8, 2, 256, 64  # batch, query heads, key/value heads, sequence, head dim
out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__),
                                                         "sdpa_cpu_bf16.json.gz")
torch.manual_seed(0)
dtype = torch.bfloat16
q = torch.randn(B, H, S, D, dtype=dtype, requires_grad=True)
k = torch.randn(B, KV, S, D, dtype=dtype, requires_grad=True)
v = torch.randn(B, KV, S, D, dtype=dtype, requires_grad=True)


def step():
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    o.backward(torch.ones_like(o))
    for t in (q, k, v):
        t.grad = None


with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
             schedule=schedule(wait=0, warmup=1, active=2, repeat=1)) as prof:
    for _ in range(3):
        step()
        prof.step()
tmp = out + ".tmp.json"
prof.export_chrome_trace(tmp)
with open(tmp) as f:
    trace = json.load(f)
os.remove(tmp)
trace["torch_version"] = torch.__version__
with gzip.open(out, "wt") as f:
    json.dump(trace, f)
print(f"recorded {out} with torch {torch.__version__}")
