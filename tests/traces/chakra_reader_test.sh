#!/usr/bin/env bash
# Chakra's own reader reads `parasol export --to chakra`'s files: et_def_pb2 compiled by protoc
# from Chakra's et_def.proto and Chakra's protolib.decodeMessage (third_party/chakra/, vendored
# from Chakra; CHAKRA_SRC=<a Chakra checkout> reads with that checkout's instead) decode every
# rank's file of tiny with tensor, pipeline, context and data parallelism: a GlobalMetadata, then
# nodes whose dependencies name nodes of the file, collectives with a comm_type, comm_size and
# pg_name of comm_group.json, sends and receives that pair across the files; each file's critical
# path by data_deps alone (what Chakra's ETFeeder, ASTRA-sim's reader, honours) equal to that with
# ctrl_deps too, and set beside `parasol simulate`'s step of the same plan.
# Usage: chakra_reader_test.sh PARASOL_BIN PROTOC SOURCE_DIR WORK_DIR
# Exits 77 (skipped) when Python's protobuf module can be had neither from python3 (Debian's
# python3-protobuf) nor by pip in a fresh virtual environment (no PyPI).
set -uo pipefail
bin=$1 protoc=$2 src=$3 work=$4
python=${PARASOL_TEST_PYTHON:-/usr/bin/python3}
chakra=${CHAKRA_SRC:-}
if [[ -n $chakra ]]; then
  proto_dir=$chakra/schema/protobuf lib_dir=$chakra/src/third_party/utils
else
  proto_dir=$src/third_party/chakra lib_dir=$src/third_party/chakra
fi
rm -rf "$work" && mkdir -p "$work/py"
if ! "$python" -c 'import google.protobuf' 2>/dev/null; then
  if ! "$python" -m venv "$work/venv" >"$work/venv.log" 2>&1; then
    echo "skipped: $python has no protobuf module (python3-protobuf) and no venv to pip install it in"
    exit 77
  fi
  # protoc's Python code of Debian 12 (3.21) needs a runtime of 3.20 to 4.x.
  if ! "$work/venv/bin/pip" install --quiet --disable-pip-version-check 'protobuf>=3.20,<5' \
      >"$work/pip.log" 2>&1; then
    echo "skipped: $python has no protobuf module and pip could not install it"
    tail -3 "$work/pip.log"; exit 77
  fi
  python=$work/venv/bin/python
fi
if ! "$protoc" -I "$proto_dir" --python_out="$work/py" "$proto_dir/et_def.proto"; then
  echo "FAIL: protoc could not compile $proto_dir/et_def.proto"; exit 1
fi
cp "$lib_dir/protolib.py" "$work/py/"
out=$work/et
if ! "$bin" export --to chakra --model tiny --cluster dgx-h100 --gpus 16 --tp 2 --pp 2 --cp 2 \
    -o "$out" >"$work/export.log" 2>&1; then
  echo "FAIL: parasol export --to chakra"; cat "$work/export.log"; exit 1
fi
if ! "$bin" simulate --json --model tiny --cluster dgx-h100 --gpus 16 --tp 2 --pp 2 --cp 2 \
    >"$work/simulate.json" 2>"$work/simulate.log"; then
  echo "FAIL: parasol simulate"; cat "$work/simulate.log"; exit 1
fi
PYTHONPATH=$work/py "$python" - "$out" "$work/simulate.json" <<'PY'
import collections, glob, json, os, sys
from et_def_pb2 import GlobalMetadata, Node, COMP_NODE, COMM_COLL_NODE, COMM_SEND_NODE, COMM_RECV_NODE
from protolib import openFileRd, decodeMessage

out = sys.argv[1]
groups = json.load(open(os.path.join(out, "comm_group.json")))
files = sorted(glob.glob(os.path.join(out, "parasol.*.et")), key=lambda p: int(p.split(".")[-2]))
assert len(files) == 16, files
attr = lambda n, k: next((a for a in n.attr if a.name == k), None)
types = collections.Counter()
sends, recvs = collections.Counter(), collections.Counter()
paths = []  # each file's critical path (us)
for path in files:
    rank = int(path.split(".")[-2])
    f = openFileRd(path)
    meta = GlobalMetadata()
    assert decodeMessage(f, meta), path
    assert meta.version == "1.0.0", meta
    nodes = []
    while True:
        n = Node()
        if not decodeMessage(f, n):
            break
        nodes.append(n)
    assert f.read() == b"", path + ": bytes after the last node"
    ids = {n.id for n in nodes}
    assert len(ids) == len(nodes) > 0, path
    for n in nodes:
        types[Node.DESCRIPTOR.fields_by_name["type"].enum_type.values_by_number[n.type].name] += 1
        for d in list(n.data_deps) + list(n.ctrl_deps):
            assert d in ids and d < n.id, (path, n.name, d)
        if n.type == COMP_NODE:
            assert attr(n, "num_ops") is not None and attr(n, "tensor_size") is not None, n
        if n.type in (COMM_COLL_NODE, COMM_SEND_NODE, COMM_RECV_NODE):
            assert attr(n, "comm_size").int64_val > 0, n
            assert rank in groups[attr(n, "pg_name").string_val], (path, n.name)
        if n.type == COMM_COLL_NODE:
            assert attr(n, "comm_type") is not None, n
        if n.type in (COMM_SEND_NODE, COMM_RECV_NODE):
            key = (attr(n, "comm_src").int32_val, attr(n, "comm_dst").int32_val,
                   attr(n, "comm_tag").int32_val, attr(n, "comm_size").int64_val)
            assert rank == (key[0] if n.type == COMM_SEND_NODE else key[1]), (path, n.name)
            (sends if n.type == COMM_SEND_NODE else recvs)[key] += 1
    # The critical path of the file's nodes as Chakra's ETFeeder (ASTRA-sim's reader) orders
    # them, by data_deps alone, and with ctrl_deps too: parasol writes each stream's order in
    # data_deps, so the feeder replays the order parasol's simulator plays (when that order was
    # in ctrl_deps only, the feeder saw a critical path a tenth of parasol's).
    def critical_path(use_ctrl):
        end = {}
        for n in sorted(nodes, key=lambda n: n.id):
            deps = list(n.data_deps) + (list(n.ctrl_deps) if use_ctrl else [])
            end[n.id] = max([end[d] for d in deps], default=0) + n.duration_micros
        return max(end.values())
    data_only, with_ctrl = critical_path(False), critical_path(True)
    assert data_only == with_ctrl, (path, data_only, with_ctrl)
    paths.append(data_only)
for t in ("COMP_NODE", "COMM_COLL_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE"):
    assert types[t] > 0, (t, types)
assert sends == recvs, "unpaired sends or receives"
# Against parasol's simulator of the same plan: no rank's own chain is longer than the simulated
# step (which plays the same ops in the same order, and the waits between ranks besides), and the
# longest is at least 30% of it (this tiny plan's is about half: the rest is its pipeline's
# bubble and its ranks' waits for each other; the lost stream order gave 11%).
step_us = json.load(open(sys.argv[2]))["step_time_s"] * 1e6
longest = max(paths)
assert longest <= step_us * 1.01 + len(files), (longest, step_us)
assert longest >= 0.3 * step_us, (longest, step_us)
print("read %d files with Chakra's reader: %s; data-deps critical path %d us of the simulated "
      "step's %.0f us" % (len(files), dict(types), longest, step_us))
PY
