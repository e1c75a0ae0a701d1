#!/usr/bin/env bash
# Installs the Debian packages ctrax needs, if any are missing.
#
#   scripts/install-deps.sh          what building and testing need (make train, make test)
#   scripts/install-deps.sh bench    what the benchmarks need besides (make bench-deps)
#   scripts/install-deps.sh --list   prints the package names and exits
#
# Each package is checked with dpkg-query. As root, the missing ones are
# installed with apt-get (after apt-get update); as anyone else, the script
# prints the sudo command that installs them and exits with status 1.
#
# Environment:
#   CTRAX_EXTRA_PACKAGES  more package names to require (to try the script)
#   CTRAX_SKIP_DEPS=1     check nothing (a machine where the tools came from
#                         somewhere other than Debian's packages)
set -euo pipefail

# This is the one list of what ctrax needs from Debian 12.
BUILD_PACKAGES=(
    build-essential         # gcc, make, libc headers
    cmake
    pkg-config
    libopenblas-openmp-dev  # BLAS (sgemm), threaded with OpenMP
    libcjson-dev
    zlib1g-dev
    libopenmpi-dev          # MPI, for training across hosts
    openmpi-bin             # mpirun
    python3
    python3-numpy
    clang                   # libFuzzer harnesses of fuzz/ (make test runs them briefly)
    libclang-rt-14-dev      # libFuzzer and clang's sanitizer runtimes
    qemu-user               # runs the kernel tests on an emulated CPU without AVX (make test)
    fortunes                # text for the default config and tests (/usr/share/games/fortunes)
    dataset-fashion-mnist   # IDX images for the MLP config and tests (/usr/share/datasets/fashion-mnist)
)
BENCH_PACKAGES=(
    python3-torch           # reference timings for the benchmarks
    libdnnl-dev             # oneDNN, timed against OpenBLAS by bench/gemm_backends.c
)

say() { printf 'install-deps: %s\n' "$*"; }

packages=("${BUILD_PACKAGES[@]}")
case "${1:-}" in
    "") ;;
    bench) packages=("${BENCH_PACKAGES[@]}") ;;
    --list) printf '%s\n' "${BUILD_PACKAGES[@]}"; exit 0 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) say "unknown argument '$1' (expected nothing, 'bench', '--list' or '--help')"; exit 2 ;;
esac
# Word splitting is wanted: a space-separated list of names.
# shellcheck disable=SC2206
packages+=(${CTRAX_EXTRA_PACKAGES:-})

if [[ "${CTRAX_SKIP_DEPS:-0}" == 1 ]]; then
    say "CTRAX_SKIP_DEPS=1: not checking ${packages[*]}"
    exit 0
fi
if ! command -v dpkg-query >/dev/null; then
    say "dpkg-query not found: this script knows Debian and Ubuntu only."
    say "Install the equivalents of: ${packages[*]}"
    say "then run again with CTRAX_SKIP_DEPS=1."
    exit 1
fi

missing=()
for p in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
    say "all ${#packages[@]} packages present"
    exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
    say "missing Debian packages: ${missing[*]}"
    say "not root, so not installing them; run:"
    printf '  sudo apt-get install %s\n' "${missing[*]}"
    exit 1
fi

say "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends "${missing[@]}" </dev/null
say "installed: ${missing[*]}"
