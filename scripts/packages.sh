# The Debian packages parasol builds against: sourced by scripts/setup.sh (which installs the
# missing ones) and tools/gpu-check.sh (which names them before building on a GPU machine that
# may have no network).
parasol_packages=(cmake g++ make libboost-graph-dev nlohmann-json3-dev libcli11-dev libgtest-dev
                  libbenchmark-dev libopenmpi-dev openmpi-bin libopenblas-dev libxxhash-dev)
# What the test command needs beyond the build (scripts/sanitize.sh): clang with its sanitizer
# and libFuzzer runtimes. Installed by setup.sh; not required by gpu-check.sh.
parasol_test_packages=(clang libclang-rt-dev)
