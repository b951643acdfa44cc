"""`import parasol` (python/): each function against the parasol executable's --json output, user
errors as parasol.Error, a model given as a dict, and the exports against `parasol export`.

Run by ctest (python_test) with PYTHONPATH=build/python and PARASOL_BIN, the parasol executable.
"""

import json
import os
import stat
import subprocess

import pytest

import parasol

BIN = os.environ.get("PARASOL_BIN", "build/tools/parasol")

# Plans as dicts and as the same flags; each exercises other keys of the plan.
TARGET = {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 16}
PLANS = [
    ({"tp": 2}, ["--tp", "2"]),
    (
        {"tp": 2, "pp": 2, "gbs": 32, "mbs": 2, "sp": True, "recompute": "selective"},
        ["--tp", "2", "--pp", "2", "--gbs", "32", "--mbs", "2", "--sp", "--recompute", "selective"],
    ),
    (
        {"tp": 1, "pp": 4, "vpp": 2, "schedule": "interleaved", "gbs": 64, "zero": 1},
        ["--pp", "4", "--vpp", "2", "--gbs", "64", "--zero", "1"],
    ),
    ({"tp": 2, "zero": 3, "gbs": 16, "tokens": 1e12}, ["--tp", "2", "--zero", "3", "--gbs", "16",
                                                         "--tokens", "1e12"]),
]


def target_flags(target=TARGET):
    return ["--model", target["model"], "--cluster", target["cluster"], "--gpus",
            str(target["gpus"])]


def cli_json(*args):
    out = subprocess.run([BIN, *args, "--json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def without(doc, *keys):
    return {k: v for k, v in doc.items() if k not in keys}


@pytest.mark.parametrize("plan,flags", PLANS)
def test_estimate_equals_cli_json(plan, flags):
    got = parasol.estimate(dict(TARGET, **plan))
    assert got == cli_json("estimate", *target_flags(), *flags)
    assert got["step_time_s"] > 0
    assert ("job" in got) == ("tokens" in plan)


@pytest.mark.parametrize("plan,flags", PLANS[:3])
def test_simulate_equals_cli_json_but_wall_times(plan, flags):
    got = parasol.simulate(dict(TARGET, **plan))
    want = cli_json("simulate", *target_flags(), *flags)
    # The seconds the lowering and the simulation took differ from run to run; all else is equal.
    wall = ("lower_wall_s", "simulate_wall_s")
    assert set(got) == set(want)
    assert without(got, *wall) == without(want, *wall)
    assert got["step_time_s"] > 0


def test_simulate_stragglers_and_trace(tmp_path):
    trace = str(tmp_path / "trace.json")
    req = dict(TARGET, tp=2, pp=2, gbs=16, slow_rank=0, slow_factor=1.5, trace=trace)
    got = parasol.simulate(req)
    want = cli_json("simulate", *target_flags(), "--tp", "2", "--pp", "2", "--gbs", "16",
                    "--slow-rank", "0", "--slow-factor", "1.5", "--trace", trace)
    wall = ("lower_wall_s", "simulate_wall_s")
    assert without(got, *wall) == without(want, *wall)
    assert got["stragglers"]["mean_s"] > got["step_time_s"]
    assert got["trace"] == trace and os.path.getsize(trace) > 0


def test_search_equals_cli_json_but_seconds():
    req = dict(TARGET, gbs=64, top=3)
    got = parasol.search(req)
    want = cli_json("search", *target_flags(), "--gbs", "64", "--top", "3")
    assert got["best_plan"] == want["best_plan"]
    assert got["best_plan"]["model"] == "llama3-8b" and got["best_plan"]["gpus"] == 16
    assert without(got, "seconds") == without(want, "seconds")
    assert len(got["top"]) == 3
    # The best plan, estimated on its own, is the search's first.
    again = parasol.estimate(got["best_plan"])
    assert again["step_time_s"] == got["top"][0]["estimate"]["step_time_s"]


def test_validate():
    got = parasol.validate(dict(TARGET, tp=2, pp=2))
    assert got == cli_json("validate", *target_flags(), "--tp", "2", "--pp", "2")
    assert got["valid"] is True and got["plan"]["dp"] == 4


def test_keywords_add_to_the_request():
    assert parasol.estimate(TARGET, tp=2) == parasol.estimate(dict(TARGET, tp=2))
    assert parasol.estimate(model="llama3-8b", cluster="dgx-h100", gpus=16, tp=2) == \
        parasol.estimate(dict(TARGET, tp=2))


def test_a_plan_document_is_a_request():
    # The "plan" of a result (with its model, cluster and GPU count) predicts the same again.
    first = parasol.estimate(dict(TARGET, tp=2, pp=2, gbs=32))
    assert parasol.estimate(first["plan"]) == first


@pytest.mark.parametrize(
    "request_dict,field",
    [
        (dict(TARGET, tp=3), "plan.tp"),
        (dict(TARGET, tp="x"), "plan.tp"),
        (dict(TARGET, schedule="zigzag"), "plan.schedule"),
        (dict(TARGET, model="no-such-model"), "model"),
        (dict(TARGET, model=7), "model"),
        (dict(TARGET, cluster={"preset": "dgx-h100", "gpus": 16, "typo": 1}), "cluster.typo"),
        (dict(TARGET, tp=2, price_per_gpu_hour=2.0), "job.tokens"),
    ],
)
def test_errors_name_the_field(request_dict, field):
    with pytest.raises(parasol.Error) as info:
        parasol.estimate(request_dict)
    e = info.value
    assert isinstance(e, ValueError)
    assert e.field == field
    assert str(e) == f"{e.field}: {e.reason}"
    assert e.reason


def test_errors_are_the_cli_errors():
    # The message is what the command line prints after "error: ".
    with pytest.raises(parasol.Error) as info:
        parasol.estimate(dict(TARGET, tp=3))
    cli = subprocess.run([BIN, "estimate", *target_flags(), "--tp", "3"], capture_output=True,
                         text=True)
    assert cli.returncode == 2
    assert cli.stderr.strip() == f"error: {info.value}"


def test_simulate_and_search_errors():
    with pytest.raises(parasol.Error) as info:
        parasol.simulate(dict(TARGET, tp=2, slow_factor=2.0))
    assert info.value.field == "stragglers.slow_rank"
    with pytest.raises(parasol.Error) as info:
        parasol.search(dict(TARGET, gbs=0))
    assert info.value.field == "search.gbs"
    with pytest.raises(parasol.Error) as info:
        parasol.search(dict(TARGET, tp=2))  # the search makes its own plans
    assert info.value.field == "search.tp"
    with pytest.raises(parasol.Error) as info:
        parasol.validate([1, 2])
    assert info.value.field == "request"


def test_a_model_dict():
    shown = cli_json("show", "model", "llama3-8b")["model"]
    by_dict = parasol.estimate(dict(TARGET, model=shown, tp=2))
    by_name = parasol.estimate(dict(TARGET, tp=2))
    # A model given as a dict has no name to refer to in the plan; all else is the preset's.
    assert "model" not in by_dict["plan"]
    assert without(by_dict, "plan") == without(by_name, "plan")
    assert by_dict["plan"] == without(by_name["plan"], "model")
    # A changed dict changes the prediction.
    smaller = dict(shown, layers=shown["layers"] // 2)
    assert parasol.estimate(dict(TARGET, model=smaller, tp=2))["step_time_s"] < \
        by_name["step_time_s"]


# A plan each framework can express (DeepSpeed's pipeline engine needs ZeRO-1 in bf16,
# torchtitan's tensor parallelism is PyTorch's DTensor TP and sequence-parallel, its data
# parallelism FSDP with it, and with a pipeline it reshards after the step).
EXPORTS = [
    ("megatron", {}, []),
    ("deepspeed", {"zero": 1}, ["--zero", "1"]),
    ("torchtitan", {"sp": True, "zero": 3, "reshard": "after_step", "tp_impl": "torch"},
     ["--sp", "--zero", "3", "--reshard", "after_step", "--tp-impl", "torch"]),
]


@pytest.mark.parametrize("framework,plan,flags", EXPORTS)
def test_export_equals_cli_files(framework, plan, flags, tmp_path):
    got = parasol.export(dict(TARGET, tp=2, pp=2, gbs=32, **plan), framework)
    assert got["framework"] == framework
    assert got["version"]
    assert got["files"]
    out = tmp_path / "out"
    subprocess.run([BIN, "export", "--to", framework, "--out", str(out), *target_flags(), "--tp",
                    "2", "--pp", "2", "--gbs", "32", *flags], check=True, capture_output=True)
    written = {p.name: p.read_text() for p in out.iterdir()}
    assert got["files"] == written
    executable = {p.name for p in out.iterdir() if p.stat().st_mode & stat.S_IXUSR}
    assert set(got["executable"]) == executable


def test_export_megatron_flags():
    got = parasol.export(dict(TARGET, tp=2, pp=2, gbs=32), "megatron")
    text = "\n".join(got["files"].values())
    assert "--tensor-model-parallel-size 2" in text
    assert "--pipeline-model-parallel-size 2" in text


def test_export_errors():
    with pytest.raises(parasol.Error) as info:
        parasol.export(dict(TARGET, tp=2), "jax")
    assert info.value.field == "export.framework"
    with pytest.raises(parasol.Error) as info:
        parasol.export(dict(TARGET, tp=3), "megatron")
    assert info.value.field == "plan.tp"


@pytest.mark.parametrize("framework", ["megatron", "deepspeed", "torchtitan"])
def test_search_for_a_framework_exports(framework):
    got = parasol.search(dict(TARGET, gbs=64, top=2, framework=framework))
    want = cli_json("search", *target_flags(), "--gbs", "64", "--top", "2", "--framework",
                    framework)
    assert without(got, "seconds") == without(want, "seconds")
    for row in got["top"]:
        parasol.export(dict(TARGET, **row["plan"]), framework)  # raises if it cannot run
    with pytest.raises(parasol.Error) as info:
        parasol.search(dict(TARGET, gbs=64, framework="nemo"))
    assert info.value.field == "search.framework"


def test_sweep_equals_cli_json_but_timing():
    request = {"model": "llama3-8b", "cluster": "dgx-h100", "gbs": 64, "threads": 1,
               "vary": {"device": ["A100-80G", "H100-SXM"], "gpus": "8:16:8"}}
    got = parasol.sweep(request)
    want = cli_json("sweep", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gbs", "64",
                    "--threads", "1", "--vary", "device=A100-80G,H100-SXM",
                    "--vary", "gpus=8:16:8")["rows"]
    for row in want:
        del row["search_s"]
    try:
        import pandas  # noqa: F401
        rows = got.to_dict("records")
        assert list(got.columns[:2]) == ["device", "gpus"]  # the axes first
        got_rows = [{k: v for k, v in r.items() if k not in ("device", "gpus", "search_s")}
                    for r in rows]
        want = [{k: v for k, v in r.items() if k != "point"} for r in want]
    except ImportError:
        got_rows = [{k: v for k, v in r.items() if k != "search_s"} for r in got]
    assert [r["index"] for r in got_rows] == [0, 1, 2, 3]
    assert [r["status"] for r in got_rows] == ["ok"] * 4
    assert [r["best_plan"] for r in got_rows] == [r["best_plan"] for r in want]
    assert [r["step_time_s"] for r in got_rows] == [r["step_time_s"] for r in want]


def test_sweep_errors_name_the_axis():
    with pytest.raises(parasol.Error) as info:
        parasol.sweep(vary={"nics": [8]})
    assert info.value.field == "--vary nics"
    with pytest.raises(parasol.Error) as info:
        parasol.sweep(vary={"nic_GBps": [50, -1]})
    assert info.value.field == "--vary nic_GBps"
    with pytest.raises(parasol.Error) as info:
        parasol.sweep(vary={"gpus": []})
    assert info.value.field == "--vary gpus"
