"""parasol from Python: the command line's estimate, simulate, search, sweep, validate and export
as functions, taking and returning dicts shaped like their --json output.

A request is a dict: the keys of a plan JSON ("tp", "pp", "dp", "mbs", "gbs", "schedule", ...)
plus "model" (a preset name, a path, or a model dict), "cluster" (a preset name, a path, or a
cluster dict), "gpus", "profile" (a path or a profile dict) and the command's own options named
as its flags ("tokens", "slow_rank", "simulate_top", ...). Keyword arguments add keys:
``parasol.estimate(model="llama3-8b", cluster="dgx-h100", gpus=8, tp=2)``.

A user error raises ``parasol.Error`` (a ValueError) with ``field`` and ``reason``, as the
command line prints ``error: <field>: <reason>``. Everything is computed by the commands' own
functions (tools/api.h) in the compiled ``_parasol``; this package only turns dicts into JSON
text and back.
"""

import json as _json

from . import _parasol

__all__ = ["Error", "estimate", "simulate", "search", "sweep", "validate", "export"]


class Error(ValueError):
    """A user error: ``field`` names the offending input ("plan.tp"), ``reason`` says why."""

    def __init__(self, field, reason):
        super().__init__(f"{field}: {reason}" if field else reason)
        self.field = field
        self.reason = reason


def _call(function, request, options, *args):
    # A request that is not a dict goes as it is: parasol rejects it naming "request".
    request = {} if request is None else request
    merged = dict(request, **options) if options else request
    try:
        text = function(_json.dumps(merged, allow_nan=False), *args)
    except _parasol.RawError as e:
        raise Error(*e.args) from None
    return _json.loads(text)


def estimate(request=None, **options):
    """``parasol estimate --json``: step time, throughput, memory, "band", "plan" (and "job"
    with "tokens")."""
    return _call(_parasol.estimate, request, options)


def simulate(request=None, **options):
    """``parasol simulate --json``: the event simulation of the plan."""
    return _call(_parasol.simulate, request, options)


def search(request=None, **options):
    """``parasol search --json``: "top", "pareto", "best_plan", ... The request has no plan keys:
    "model", "cluster", "gpus" (default 1024), "profile", "gbs", "seq", "top", "threads",
    "precision", "no_offload", "simulate_top", "robust" and the job options."""
    return _call(_parasol.search, request, options)


def sweep(request=None, **options):
    """``parasol sweep``: the best plan on every cluster of a grid. The request is a sweep file's
    dict ("model", "cluster", "gpus", "gbs", "seq", "tokens", "price_per_gpu_hour",
    "device_price", "framework", "robust", "simulate_top", "no_offload", "vary": {key: [values]
    or "START:STOP:STEP"}) plus "threads". Returns the rows (one dict per point, as
    ``parasol sweep --json``'s "rows"): a pandas DataFrame when pandas can be imported, with the
    axis values as columns beside the rows' keys, else the list of dicts."""
    rows = _call(_parasol.sweep, request, options)["rows"]
    try:
        import pandas
    except ImportError:
        return rows
    frame = pandas.DataFrame(rows)
    points = pandas.DataFrame([row["point"] for row in rows], index=frame.index)
    return pandas.concat([points, frame.drop(columns=["point"])], axis=1)


def validate(request=None, **options):
    """``parasol validate --json``: {"valid": True, "plan": ...}; raises Error when the plan
    cannot run."""
    return _call(_parasol.validate, request, options)


def export(request, framework, **options):
    """The plan of the request in another framework's terms: framework is "megatron",
    "deepspeed" or "torchtitan"; returns {"framework", "version", "files": {name: text},
    "executable": [names of the scripts]}."""
    return _call(_parasol.export, request, options, framework)
