#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/, CTRAX_FUZZ) in build-fuzz/ with clang
# and runs each for SECONDS_PER_HARNESS (default 60), starting from its seed
# corpus fuzz/corpus/<harness>/. New inputs go to a scratch copy, never into
# the repository. Prints per harness the executions, the time and, for a
# finding (a crash, a leak, a sanitizer report, an input over the time or
# memory limits), the reproducer's path; exits 1 if there was any finding,
# 2 if the harnesses could not be built.
#
#   scripts/fuzz.sh [SECONDS_PER_HARNESS] [HARNESS...]
#
# Environment:
#   FUZZ_FINDINGS  where reproducers are written (default: a new directory
#                  /tmp/ctrax-fuzz-findings.XXXXXX, removed when empty)
#   FUZZ_JOBS      build parallelism (default: nproc)
#   FUZZ_ARGS      more libFuzzer flags for every harness (e.g. -seed=1)
# A reproducer reruns with: build-fuzz/<harness> <file>.
set -uo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
fi
cd "$(dirname "$0")/.." || exit 2

seconds=${1:-60}
shift $(($# > 0 ? 1 : 0))
if ! [[ $seconds =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: scripts/fuzz.sh [SECONDS_PER_HARNESS] [HARNESS...]" >&2
    exit 2
fi
if ! command -v clang >/dev/null; then
    echo "fuzz: clang is missing (Debian: apt-get install clang libclang-rt-14-dev)" >&2
    exit 2
fi

echo "== fuzz: configure and build in build-fuzz/"
if ! CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCTRAX_SANITIZE=ON -DCTRAX_WERROR=ON \
    -DCTRAX_FUZZ=ON >/dev/null || ! cmake --build build-fuzz -j "${FUZZ_JOBS:-$(nproc)}" --target fuzz; then
    echo "== fuzz: build FAILED"
    exit 2
fi

if (($# > 0)); then
    harnesses=("$@")
else
    harnesses=()
    for src in fuzz/fuzz_*.c; do
        name=$(basename "$src" .c)
        harnesses+=("$name")
    done
fi

# Scratch: the growing corpora and the harnesses' own temporary files
# (fuzz_util.c makes its directory under $TMPDIR); tmpfs when there is one.
scratch_base=/tmp
[[ -d /dev/shm && -w /dev/shm ]] && scratch_base=/dev/shm
scratch=$(mktemp -d "$scratch_base/ctrax-fuzz.XXXXXX") || exit 2
trap 'rm -rf "$scratch"' EXIT
if [[ -n ${FUZZ_FINDINGS:-} ]]; then
    findings=$FUZZ_FINDINGS
    mkdir -p "$findings" || exit 2
else
    findings=$(mktemp -d /tmp/ctrax-fuzz-findings.XXXXXX) || exit 2
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
n_found=0
summary=()
for name in "${harnesses[@]}"; do
    bin=build-fuzz/$name
    if [[ ! -x $bin ]]; then
        echo "fuzz: no harness $bin" >&2
        n_found=$((n_found + 1))
        summary+=("$(printf '%-20s NOT BUILT' "$name")")
        continue
    fi
    seeds=fuzz/corpus/$name
    mkdir -p "$scratch/corpus/$name" "$scratch/tmp/$name"
    dict=()
    case $name in
        fuzz_config) dict=(-dict=fuzz/gin.dict) ;;
        fuzz_safetensors | fuzz_checkpoint | fuzz_loop_state | fuzz_metrics) dict=(-dict=fuzz/json.dict) ;;
    esac
    log=$scratch/$name.log
    echo "== fuzz: $name for ${seconds}s"
    start=$(date +%s%N)
    # The first corpus directory gets the new inputs; the seeds are only read.
    # -close_fd_mask=3: the readers' messages on stderr are noise; libFuzzer
    # and the sanitizers keep their own copy of stderr for reports.
    # shellcheck disable=SC2086
    TMPDIR=$scratch/tmp/$name "$bin" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 \
        -close_fd_mask=3 -print_final_stats=1 -artifact_prefix="$findings/$name-" "${dict[@]}" ${FUZZ_ARGS:-} \
        "$scratch/corpus/$name" "$seeds" >"$log" 2>&1
    rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    elapsed=$((ms / 1000)).$((ms % 1000 / 100))
    execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | tail -n 1 | grep -oE '[0-9]+$')
    added=$(grep -oE 'stat::new_units_added: *[0-9]+' "$log" | tail -n 1 | grep -oE '[0-9]+$')
    line=$(printf '%-20s %8s execs %6ss  %4s new inputs' "$name" "${execs:-?}" "$elapsed" "${added:-?}")
    if ((rc != 0)); then
        n_found=$((n_found + 1))
        repro=$(grep -oE 'Test unit written to [^ ]+' "$log" | tail -n 1 | sed 's/Test unit written to //')
        # The report: from the first sanitizer or libFuzzer error line on.
        grep -m 1 -A 40 -E '^==[0-9]+==ERROR|runtime error|^==[0-9]+== ERROR: libFuzzer|^ALARM|deadly signal' "$log" | sed 's/^/    /'
        cp "$log" "$findings/$name.log"
        line+="  FINDING (exit $rc): ${repro:-no reproducer written}, log $findings/$name.log"
    fi
    summary+=("$line")
    echo "$line"
done

echo "== fuzz: summary (${seconds}s per harness)"
printf '%s\n' "${summary[@]}"
if ((n_found > 0)); then
    echo "fuzz: $n_found finding(s); reproducers in $findings (rerun one: build-fuzz/<harness> FILE)"
    exit 1
fi
[[ -n ${FUZZ_FINDINGS:-} ]] || rmdir "$findings" 2>/dev/null
echo "fuzz: no findings"
