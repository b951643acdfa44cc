# The Debian packages parasol builds against: sourced by scripts/setup.sh (which installs the
# missing ones) and tools/gpu-check.sh (which names them before building on a GPU machine that
# may have no network).
parasol_packages=(cmake g++ make libboost-graph-dev nlohmann-json3-dev libcli11-dev libgtest-dev
                  libbenchmark-dev libopenmpi-dev openmpi-bin libopenblas-dev libxxhash-dev)
