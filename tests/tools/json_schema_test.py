"""Every --json output of parasol against its JSON Schema (docs/schema/<command>.schema.json).

Runs each command with --json on a few inputs (estimate, estimate --tokens's job block,
simulate, search, show model/cluster/plan/program, validate, run (one rank, tiny), export (each
framework), trace import, compare (and --measured), calibrate (and --measured)
(a measured trace, and --probe, alone and under mpirun with 2 ranks), accuracy) and
validates the output with jsonschema (Debian's python3-jsonschema: run with /usr/bin/python3).
Also checks that the schemas are strict enough to be a check: each is a valid draft 2020-12
schema, every property has a description, and outputs with a required field removed, an
unknown field added or a time set to 0 are rejected.

Usage: /usr/bin/python3 json_schema_test.py PARASOL_BIN SCHEMA_DIR DATA_DIR WORK_DIR [MPIRUN]
"""
import copy
import json
import os
import pathlib
import subprocess
import sys

import jsonschema

parasol, schema_dir, data_dir, work = sys.argv[1:5]
mpirun = sys.argv[5] if len(sys.argv) > 5 else None
schema_dir = pathlib.Path(schema_dir)
work = pathlib.Path(work)
work.mkdir(parents=True, exist_ok=True)

schemas = {}
for path in sorted(schema_dir.glob("*.schema.json")):
    s = json.loads(path.read_text())
    jsonschema.Draft202012Validator.check_schema(s)
    schemas[path.name.removesuffix(".schema.json")] = s
store = {s["$id"]: s for s in schemas.values()}
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg)


def resolve(ref, base):
    """The subschema a $ref names (relative to the schema `base`)."""
    doc, _, pointer = ref.partition("#")
    target = store[base["$id"].rsplit("/", 1)[0] + "/" + doc] if doc else base
    for part in filter(None, pointer.split("/")):
        target = target[part]
    return target, (store[base["$id"].rsplit("/", 1)[0] + "/" + doc] if doc else base)


def check_descriptions(node, base, where):
    """Every property (and every $defs entry used as one) says what it is: a description on it
    or on what its $ref names."""
    if isinstance(node, dict):
        for name, sub in node.get("properties", {}).items():
            desc = sub.get("description")
            if desc is None and "$ref" in sub:
                desc = resolve(sub["$ref"], base)[0].get("description")
            if not desc:
                fail(f"{where}.properties.{name}: no description")
        for key, sub in node.items():
            check_descriptions(sub, base, f"{where}.{key}")
    elif isinstance(node, list):
        for i, sub in enumerate(node):
            check_descriptions(sub, base, f"{where}[{i}]")


for name, s in schemas.items():
    check_descriptions(s, s, name)


def validator(name):
    s = schemas[name]
    resolver = jsonschema.RefResolver(base_uri=s["$id"], referrer=s, store=store)
    return jsonschema.Draft202012Validator(s, resolver=resolver)


def errors(name, doc):
    return sorted(validator(name).iter_errors(doc), key=lambda e: list(e.path))


def run_json(args, launcher=()):
    r = subprocess.run(list(launcher) + [parasol] + args, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"parasol {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
        return None
    return json.loads(r.stdout)


def check(name, args, launcher=()):
    doc = run_json(args, launcher)
    if doc is None:
        return None
    errs = errors(name, doc)
    for e in errs[:5]:
        fail(f"{name}: parasol {' '.join(args)}: at /{'/'.join(map(str, e.path))}: {e.message}")
    if not errs:
        print(f"ok: {name}: parasol {' '.join(args)}")
    return doc


def expect_invalid(name, doc, what):
    if doc is not None and not errors(name, doc):
        fail(f"{name}: the schema accepts an output with {what}")


T = "--model llama3-8b --cluster dgx-h100 --gpus 16 --tp 2 --pp 2 --gbs 64".split()
MOE = "--model mixtral-8x7b --cluster dgx-h100 --gpus 16 --tp 2 --ep 4 --gbs 64".split()
TOKENS = ["--tokens", "1e11"]

# estimate: dense, MoE with ZeRO-3 and selective recompute, offload, and the job block.
est = check("estimate", ["estimate", "--json"] + T)
check("estimate", ["estimate", "--json"] + MOE +
      "--zero 3 --recompute selective --recompute-modules core_attn,moe_act --sp".split())
check("estimate", ["estimate", "--json", "--model", "llama3-70b", "--cluster", "dgx-h100",
                   "--gpus", "8", "--tp", "8", "--gbs", "8", "--offload", "optimizer"])
# Megatron's --fp8-param-gather: the plan carries fp8_param_gather.
fp8pg = check("estimate", ["estimate", "--json"] + T +
              "--zero 1 --precision fp8 --grad-reduce-dtype bf16 --fp8-param-gather".split())
if fp8pg is not None and fp8pg["plan"].get("fp8_param_gather") is not True:
    fail("estimate --fp8-param-gather: no plan.fp8_param_gather")
job = check("estimate", ["estimate", "--json"] + T + TOKENS + ["--price-per-gpu-hour", "2.5"])
check("estimate", ["estimate", "--json"] + MOE + TOKENS + ["--checkpoint-interval", "3600"])
if job is not None and "job" not in job:
    fail("estimate --tokens: no job block")

# validate and show.
val = check("validate", ["validate", "--json"] + T)
check("validate", ["validate", "--json"] + MOE + ["--zero", "3"])
show = check("show", ["show", "--json"] + T)
for m in ["llama3-8b", "mixtral-8x7b", "deepseek-v3", "mistral-7b", "gpt2-124m",
          os.path.join(data_dir, "hf", "qwen3_30b_a3b_config.json")]:
    check("show", ["show", "model", m, "--json"])
check("show", ["show", "cluster", "dgx-a100-80g", "--json"])
# show model|cluster|device without a name: the preset listings; show device NAME: one datasheet.
for what in ["model", "cluster", "device"]:
    check("presets", ["show", what, "--json"])
check("presets", ["show", "device", "H100-SXM", "--json"])
check("show", ["show", "plan", "--json"] + MOE)
# torchtitan's op-level selective AC: the plan's recompute value in the schema's enum.
check("show", ["show", "plan", "--json", "--model", "llama3-8b", "--cluster", "dgx-h100",
               "--gpus", "8", "--zero", "3", "--gbs", "16", "--recompute", "selective_op"])
# show program: a pipeline stage of a dense plan, an MoE rank with ZeRO-3, offload and recompute.
check("program", ["show", "program", "--json", "--rank", "5"] + T)
check("program", ["show", "program", "--json", "--model", "tiny-moe", "--cluster", "dgx-h100",
                  "--gpus", "8", "--tp", "2", "--ep", "2", "--zero", "3", "--gbs", "8",
                  "--recompute", "full"])
check("program", ["show", "program", "--json", "--model", "tiny", "--cluster", "dgx-h100",
                  "--gpus", "8", "--tp", "2", "--cp", "2", "--gbs", "16",
                  "--offload", "optimizer,activations", "--recompute", "selective"])
check("program", ["show", "program", "--json", "--model", "llama3-8b", "--cluster", "dgx-h100",
                  "--gpus", "16", "--pp", "4", "--vpp", "2", "--gbs", "64", "--rank", "3"])

# simulate: plain with a trace, stragglers, the job block.
trace = str(work / "predicted.json")
sim = check("simulate", ["simulate", "--json", "--trace", trace] + T)
check("simulate", ["simulate", "--json", "--model", "tiny", "--cluster", "dgx-h100", "--gpus",
                   "8", "--tp", "2", "--pp", "2", "--gbs", "16", "--rank-cv", "0.05",
                   "--samples", "20"])
check("simulate", ["simulate", "--json"] + MOE + TOKENS + ["--slow-rank", "3"])

# search: plain with simulated top plans, by time to train, robust.
S = "--model llama3-8b --cluster dgx-h100 --gpus 16 --gbs 64 --top 3".split()
search = check("search", ["search", "--json", "--simulate-top", "2"] + S)
check("search", ["search", "--json"] + S + TOKENS)
sim_job = check("search", ["search", "--json", "--simulate-top", "2"] + S + TOKENS)
if sim_job is not None and ("simulated_job" not in sim_job["top"][0]
                            or "job" not in sim_job["pareto"][0]):
    fail("search --tokens --simulate-top: no simulated_job on the first row or no job on the front")
check("search", ["search", "--json", "--robust"] + S)

# compare: the predicted trace against itself as the measurement, and against a Megatron-LM log.
if os.path.exists(trace):
    check("compare", ["compare", "--json", trace, trace])
    log = work / "megatron.log"
    log.write_text("".join(
        f" [2026-12-02 10:00:0{i}] iteration {i + 1}/ 100 | consumed samples: {64 * (i + 1)} | "
        f"elapsed time per iteration (ms): {900.0 + i:.1f} | learning rate: 1.0E-04 |\n"
        for i in range(4)))
    check("compare", ["compare", "--json", trace, str(log)])

# run (one rank of the CPU runtime, tiny, a few steps) then compare and calibrate on its trace.
measured = str(work / "measured.json")
predicted_tiny = str(work / "predicted_tiny.json")
TINY = "--model tiny --cluster localhost --gpus 1".split()
run = check("run", ["run", "--json", "--steps", "3", "--trace", measured] + TINY)
check("simulate", ["simulate", "--json", "--trace", predicted_tiny, "--precision", "fp32"] + TINY)
if os.path.exists(measured) and os.path.exists(predicted_tiny):
    check("compare", ["compare", "--json", predicted_tiny, measured])
    check("calibrate", ["calibrate", "--json", measured, "-o", str(work / "fitted.json")])

# trace import, compare --measured and calibrate --measured on the bundled PyTorch profiler traces
# (tests/data/traces: two ranks of an A100 job in fp32, and one rank of a 2-GPU job).
kineto = [os.path.join(data_dir, "traces", f"hta_sampled_rank-{r}.json.gz") for r in (0, 1)]
nccl = os.path.join(data_dir, "traces", "hta_nccl_step5_rank-0.json.gz")
# The sampled ranks are 2 of a 128-rank job: the plan has its world size. --allow-worse writes the
# fitted profile even where it replays the kernels further from the trace than the default one.
A100 = "--model tiny --cluster dgx-a100-80g --gpus 128 --precision fp32".split()
imported = check("trace-import", ["trace", "import", "--json", "-o", str(work / "imported.json")]
                 + kineto)
check("trace-import", ["trace", "import", "--json", nccl])
check("compare", ["compare", "--json", "--measured"] + kineto + A100)
check("calibrate", ["calibrate", "--json", "--allow-worse", "-o", str(work / "kineto_fitted.json"),
                    "--measured"] + kineto + A100)
if imported is not None:
    d = copy.deepcopy(imported); del d["unclassified"]
    expect_invalid("trace-import", d, "no unclassified list")
    d = copy.deepcopy(imported); d["collectives"][0]["kind"] = "gather"
    expect_invalid("trace-import", d, "an unknown collective kind")
    d = copy.deepcopy(imported); d["steps"] = 0; expect_invalid("trace-import", d, "steps 0")

# export: each framework's files of one plan it can run.
EXPORTS = {"megatron": ["--tp", "2"], "deepspeed": ["--zero", "2"],
           "torchtitan": ["--tp", "2", "--sp", "true", "--zero", "3", "--tp-impl", "torch"]}
for target, plan in EXPORTS.items():
    doc = check("export", ["export", "--to", target, "--json", "--model", "llama3-8b",
                           "--cluster", "dgx-h100", "--gpus", "16", "--gbs", "64"] + plan)
    if doc is not None and not set(doc["executable"]) <= set(doc["files"]):
        fail(f"export --to {target}: an executable file that is not among the files")

# accuracy: one published suite, and with the event simulator.
suite = os.path.join(data_dir, "published", "h100-dense.json")
check("accuracy", ["accuracy", "--json", suite])

# calibrate --probe: times this host's sgemm and memory (seconds), writes a profile.
probe = check("calibrate", ["calibrate", "--probe", "--json", "-o", str(work / "host_profile.json")])
if probe is not None and "link" in probe:
    fail("calibrate --probe: a link measured by a process on its own")
# Under mpirun with 2 ranks, rank 0 alone prints, with the all-reduces timed (tools/link_probe.h).
if mpirun:
    probe2 = check("calibrate", ["calibrate", "--probe", "--json", "-o", str(work / "host2.json")],
                   [mpirun, "--oversubscribe", "--bind-to", "none", "-np", "2"])
    if probe2 is not None and (probe2.get("link", {}).get("ranks") != 2
                               or len(probe2["link"]["all_reduce"]) != 5):
        fail(f"calibrate --probe under mpirun -np 2: no link of 2 ranks and 5 sizes: {probe2}")

# sweep: two devices by two GPU counts (one of which cannot hold the model: a no_plan row), with
# tokens and a price for one device; the journal of --out reads as the same rows.
journal = str(work / "sweep.jsonl")
sweep = check("sweep", ["sweep", "--json", "--model", "llama3-8b", "--cluster", "dgx-h100",
                        "--gbs", "64", "--vary", "device=A100-80G,H200", "--vary",
                        "gpus=1,16", "--no-offload", "--tokens", "1e11", "--device-price",
                        "H200=3", "--out", journal])
if sweep is not None:
    statuses = [r["status"] for r in sweep["rows"]]
    if statuses != ["no_plan", "ok", "no_plan", "ok"]:
        fail(f"sweep: statuses {statuses}, expected no_plan, ok, no_plan, ok")
    lines = [json.loads(l) for l in open(journal)]
    if lines[0] != {"sweep": sweep["sweep"]} or sorted(
            (r["index"] for r in lines[1:])) != [0, 1, 2, 3]:
        fail("sweep --out: the journal is not the header and the four rows")

# The schemas reject what they should.
if est is not None:
    d = copy.deepcopy(est); del d["step_time_s"]; expect_invalid("estimate", d, "no step_time_s")
    d = copy.deepcopy(est); d["bogus"] = 1; expect_invalid("estimate", d, "an unknown field")
    d = copy.deepcopy(est); d["step_time_s"] = 0; expect_invalid("estimate", d, "step_time_s 0")
    d = copy.deepcopy(est); d["plan"]["tp"] = 0; expect_invalid("estimate", d, "plan.tp 0")
    d = copy.deepcopy(est); d["plan"]["fp8_param_gather"] = False
    expect_invalid("estimate", d, "plan.fp8_param_gather false (present only when true)")
    d = copy.deepcopy(est); d["plan"]["bogus"] = 1
    expect_invalid("estimate", d, "an unknown plan field")
    d = copy.deepcopy(est); d["time_breakdown_s"]["bogus"] = 1.0
    expect_invalid("estimate", d, "an unknown time breakdown")
    d = copy.deepcopy(est); d["band"]["fraction"] = "9%"
    expect_invalid("estimate", d, "a string band")
    # The peak's rank and its allocated / reserved / outside-the-allocator parts are required.
    d = copy.deepcopy(est); del d["peak_rank"]; expect_invalid("estimate", d, "no peak_rank")
    for part in ("allocated_bytes", "reserved_bytes", "outside_bytes"):
        d = copy.deepcopy(est); del d["memory_per_stage"][0][part]
        expect_invalid("estimate", d, "no memory_per_stage[0]." + part)
        d = copy.deepcopy(est); del d["memory"][part]
        expect_invalid("estimate", d, "no memory." + part)
if job is not None and "job" in job:
    d = copy.deepcopy(job); del d["job"]["goodput"]; expect_invalid("estimate", d, "no job.goodput")
    d = copy.deepcopy(job); d["job"]["goodput"] = 1.5; expect_invalid("estimate", d, "goodput 1.5")
if val is not None:
    d = copy.deepcopy(val); d["valid"] = False; expect_invalid("validate", d, "valid false")
if show is not None:
    d = copy.deepcopy(show); del d["parameters"]; expect_invalid("show", d, "no parameters")
if sim is not None:
    d = copy.deepcopy(sim); d["stages"][0]["bogus"] = 1
    expect_invalid("simulate", d, "an unknown stage field")
    d = copy.deepcopy(sim); d["breakdown_s"]["stage"] = 0
    expect_invalid("simulate", d, "a stage number in the critical breakdown")
if sweep is not None:
    d = copy.deepcopy(sweep); del d["rows"][1]["train"]
    expect_invalid("sweep", d, "an ok row without its train figures")
    d = copy.deepcopy(sweep); del d["rows"][0]["reason"]
    expect_invalid("sweep", d, "a no_plan row without its reason")
if search is not None:
    d = copy.deepcopy(search); d["top"][0]["estimate"]["bogus"] = 1
    expect_invalid("search", d, "an unknown estimate field")
    d = copy.deepcopy(search); d["top"] = []; expect_invalid("search", d, "an empty top list")

if run is not None:
    d = copy.deepcopy(run); d["steps"][0]["seconds"] = 0
    expect_invalid("run", d, "a step of 0 s")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("PASS")
