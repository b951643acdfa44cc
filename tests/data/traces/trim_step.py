#!/usr/bin/env python3
# Trims a Kineto trace to one profiler step (how hta_nccl_step5_rank-0.json.gz was made, see
# README.md): metadata events, host events that start within the step's ProfilerStep#N
# annotation, and the device activities those runtime calls launched (by "correlation").
# Usage: trim_step.py IN.json.gz ProfilerStep#5 OUT.json  (then gzip -9 OUT.json)
import gzip, json, sys

src, step, dst = sys.argv[1:4]
d = json.load(gzip.open(src) if src.endswith(".gz") else open(src))
ev = d["traceEvents"]
s = next(e for e in ev if e.get("name") == step)
a, b = s["ts"], s["ts"] + s["dur"]
host = {"cpu_op", "cuda_runtime", "user_annotation", "cuda_driver"}
keep = [e for e in ev if e.get("ph") == "X" and e.get("cat") in host and a <= e["ts"] <= b]
corr = {e["args"]["correlation"] for e in keep
        if e["cat"] in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
dev = [e for e in ev if e.get("ph") == "X"
       and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
       and e.get("args", {}).get("correlation") in corr]
d["traceEvents"] = [e for e in ev if e.get("ph") == "M"] + keep + dev
json.dump(d, open(dst, "w"))
