# The Debian packages parasol builds against: sourced by scripts/setup.sh (which installs the
# missing ones) and tools/gpu-check.sh (which names them before building on a GPU machine that
# may have no network). protobuf-compiler and libprotobuf-dev compile and link Chakra's
# execution-trace schema (third_party/chakra/, `parasol export --to chakra`).
parasol_packages=(cmake g++ make libboost-graph-dev nlohmann-json3-dev libcli11-dev libgtest-dev
                  libbenchmark-dev libopenmpi-dev openmpi-bin libopenblas-dev libxxhash-dev
                  zlib1g-dev libsqlite3-dev protobuf-compiler libprotobuf-dev)
# What the test command needs beyond the build (scripts/sanitize.sh): clang with its sanitizer
# and libFuzzer runtimes; python3-jsonschema validates the --json outputs against docs/schema
# (tests/tools/json_schema_test.py, run with /usr/bin/python3). Installed by setup.sh; not
# required by gpu-check.sh. chromium renders `parasol report`'s page headless
# (tests/report/render_test.sh). pybind11-dev and python3-dev build `import parasol`
# (python/, built only when they are found: the command line does not need them, so they are not
# in parasol_packages and a GPU machine without them still builds), python3-pytest runs its tests
# (tests/python); python3-venv makes the fresh virtual environment `pip install .` is tested in
# (tests/python/pip_install_test.sh; scikit-build-core and pybind11 come from PyPI).
# python3-protobuf runs Chakra's Python reader on the Chakra exports
# (tests/traces/chakra_reader_test.sh).
parasol_test_packages=(clang libclang-rt-dev python3-jsonschema chromium pybind11-dev python3-dev
                       python3-pytest python3-venv python3-protobuf)
