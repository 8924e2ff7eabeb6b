#!/usr/bin/env bash
# The GPU figures of docs/performance.md ("On a GPU"), in one run of two to three
# minutes (about two on an H200) on a machine with a GPU, its JAX preinstalled for `python3`, and no
# network:
#
#     bash benchmarks/device.sh            # from the repository root
#
# It prints the GPU and JAX version, installs this tree (editable, no
# dependencies: JAX, numpy and pyarrow must be there), runs a smoke test of lox
# on that JAX (core tests that need no tracker nor moto, on the machine's CPU
# with eight host devices, as CI does), then the GPU sections of `python -m
# benchmarks`, each in a process of its own under its own time limit, so that
# one slow section leaves the others their figures. Everything printed is also
# written to $OUT/bench_gpu.txt when $OUT is set. BENCH_SECONDS (default 290)
# bounds the whole run: a part starts only with the time it needs left.
set -u
cd "$(dirname "$0")/.."
out="${OUT:-.}/bench_gpu.txt"
budget="${BENCH_SECONDS:-290}"
start=$SECONDS
export PYTHONUNBUFFERED=1

left() { echo $((budget - (SECONDS - start))); }

# part NAME SECONDS COMMAND...: COMMAND under `timeout` of SECONDS (less if the
# run's budget has less), skipped with a line saying so when under 10 s remain.
part() {
    local name=$1 limit=$2 rest
    shift 2
    rest=$(left)
    ((rest < limit)) && limit=$rest
    if ((limit < 10)); then
        echo "== $name: skipped, the run's ${budget} s are spent"
        return
    fi
    echo "== $name (at most ${limit} s)"
    local t0=$SECONDS
    timeout "$limit" "$@"
    local rc=$?
    if ((rc == 124)); then
        echo "== $name: stopped after ${limit} s (timeout)"
    elif ((rc != 0)); then
        echo "== $name: failed (exit status $rc)"
    fi
    echo "== $name: $((SECONDS - t0)) s"
}

{
    echo "== device"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || echo "no nvidia-smi"
    python3 -c "import jax, jaxlib; print('JAX', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"

    part install 60 python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .

    # The core of lox on this JAX, a test file per process (all at once, each
    # under 70 s): no conftest, which imports the trackers and moto (absent here).
    JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=8 part smoke 80 bash -c '
        logs=$(mktemp -d)
        for f in "$@"; do
            (timeout 70 python3 -m pytest -q -x --noconftest -p no:cacheprovider "tests/lox_core/$f.py" \
                >"$logs/$f" 2>&1; echo $? >"$logs/$f.rc") &
        done
        wait
        rc=0
        for f in "$@"; do
            code=$(cat "$logs/$f.rc")
            echo "  $f: $(tail -n 1 "$logs/$f") (exit status $code)"
            if [ "$code" != 0 ]; then tail -n 40 "$logs/$f"; echo; rc=1; fi
        done
        exit $rc' _ test_spool test_tap test_spool_while test_tap_buffer test_interpreter

    sections="steady:35 tap:25 buffer:60 logger:60"
    sections="$sections active:40 system:30"
    for entry in $sections; do
        part "benchmarks ${entry%%:*}" "${entry##*:}" python3 -m benchmarks "${entry%%:*}"
    done
    echo "== total: $((SECONDS - start)) s"
} 2>&1 | tee "$out"
