#!/usr/bin/env bash
# Installs the missing build dependencies (Debian 12 / Ubuntu 24.04 package names; nothing when
# all are present, as on the GPU machine, which has no network), then configures and builds
# Quintet into build/ (Release, tests and examples on) with all cores.
# Extra arguments are passed to cmake's configure step, e.g. -DQUINTET_WITH_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake g++ make libopenmpi-dev openmpi-bin libeigen3-dev libfmt-dev libcli11-dev
          nlohmann-json3-dev iproute2)
# hwloc: the machine's topology (optional to the build, QUINTET_WITH_HWLOC; wanted for placement).
packages+=(libhwloc-dev)
# Catch2: Debian 12 ships v2 as "catch2"; Ubuntu 24.04 ships v3 under the same name.
packages+=(catch2)
# The Python module quintet_data (python/): headers, NumPy and pybind11 for the system python3.
packages+=(python3-dev python3-numpy pybind11-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# A package may be absent while the software is present another way (the GPU image builds some
# from source): only install what is really missing.
have() { command -v "$1" >/dev/null 2>&1; }
filtered=()
for p in "${missing[@]}"; do
  case "$p" in
    cmake) have cmake || filtered+=("$p") ;;
    g++) have g++ || filtered+=("$p") ;;
    make) have make || filtered+=("$p") ;;
    openmpi-bin) have mpirun || filtered+=("$p") ;;
    libopenmpi-dev) have mpicxx || filtered+=("$p") ;;
    iproute2) have ip || filtered+=("$p") ;;
    python3-numpy) python3 -c "import numpy" 2>/dev/null || filtered+=("$p") ;;
    pybind11-dev) python3 -m pybind11 --cmakedir >/dev/null 2>&1 || filtered+=("$p") ;;
    python3-dev) python3 -c "import sysconfig, os; p = sysconfig.get_paths()['include']; \
                 assert os.path.exists(os.path.join(p, 'Python.h'))" 2>/dev/null ||
                 filtered+=("$p") ;;
    *) filtered+=("$p") ;;
  esac
done
if ((${#filtered[@]})); then
  echo "setup: installing ${filtered[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  # A machine without network (the GPU machine) cannot install: say so and let cmake report
  # anything that is really missing.
  if ! { $SUDO apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
           "${filtered[@]}"; }; then
    echo "setup: warning: could not install ${filtered[*]}; continuing with what is present" >&2
  fi
fi

jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DQUINTET_BUILD_TESTS=ON \
      -DQUINTET_BUILD_EXAMPLES=ON "$@"
cmake --build build -j "$jobs"
