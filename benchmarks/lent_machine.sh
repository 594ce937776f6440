#!/usr/bin/env bash
# Issues #29 and #30 on a lent machine with many cores and a GPU, in one call of under 5 minutes (512 MiB):
#
#     bash benchmarks/lent_machine.sh OUT [MIB [STEP...]]
#
# OUT gets each step's log (the sections print their tables there), packed into OUT/logs.tgz at the end.
# MIB (default 512) sizes the scaling and GPU sections' files; the probe takes half. STEP names the steps to
# run (scaling, probe, probe-before, startup, startup-before, startup-forkserver, start-methods, gpu, gpu-before, batches,
# batches-readers, batches-before, device-ratio, window-waits, epoch-start, epoch-scale, cuda-tests; default all). Each step runs under its own time limit (16 min of limits together at 512 MiB, in
# proportion above; a call of the device tool, 10 min at most, names its steps), so one that hangs leaves the others theirs; the steps before startup-forkserver,
# start-methods and gpu-before took 3 min 7 s together on a lent H100 machine with 16 cores (2026-11-26); on
# another (2026-11-28) gpu, gpu-before, batches, epoch-start and cuda-tests took 83 s at 512 MiB, scaling 137 s at 1024.
# The steps:
#   1. the machine: CPUs, GPU, versions;
#   2. the scaling section (#29: multitables against N plain h5py processes and DataLoader, counters);
#   3. the probe (#29: where many readers' time goes, with and without the hints; again with a carried older
#      package where .devrun/before has one), and what starting 16 readers costs (benchmarks/stream_startup.py,
#      fork and forkserver; benchmarks/start_methods.py: in a process holding 4 GiB);
#   4. the GPU section (#30: device=, pin_memory, DataLoader; again with the carried older package), where
#      shuffled batches lose against the stream, CPU only and with device="cuda"
#      (benchmarks/batches_profile.py), CPU-only batches against the carried older package's, alternating
#      (benchmarks/ab_batches.py), what an epoch's first batches cost the consumer (benchmarks/epoch_start.py;
#      benchmarks/epoch_scale.py with 50 pieces a MiB: 25,600 at 512), and the CUDA tests.
# The start steps read the probe's zlib file, or the GPU section's where the probe did not run.
# Wheels the machine lacks (PyTables, hdf5plugin, imagecodecs, blosc2...) are installed from .whl/ first
# (benchmarks/lent_machine_carry.sh makes it, and .devrun/before),
# where they are missing and the checkout has one (see the device tool's notes on carrying wheels).
set -u
out=${1:?usage: bash benchmarks/lent_machine.sh OUT [MIB]}
mib=${2:-512}
shift $(($# < 2 ? $# : 2))
steps=" ${*:-scaling probe probe-before startup startup-before startup-forkserver start-methods gpu gpu-before batches batches-readers batches-before device-ratio window-waits epoch-start epoch-scale cuda-tests} "
mkdir -p "$out" && out=$(cd "$out" && pwd)  # absolute: a step may run elsewhere
work=$(mktemp -d "${TMPDIR:-/tmp}/lent_machine.XXXXXX")  # fresh: a file left by an earlier run is refused
trap 'rm -rf "$work"' EXIT
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout, and multitables_bench for the scripts
if [ -d .whl ] && ! python3 -c 'import tables, hdf5plugin, imagecodecs, blosc2' 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$work/site" .whl/*.whl \
        && export PYTHONPATH="$work/site:$PYTHONPATH" || { echo "the wheels did not install" >&2; exit 1; }
fi

step() {  # step NAME SECONDS COMMAND...: run it, its output in OUT/NAME.log, and say how it ended
    local name=$1 limit=$(($2 * (mib > 512 ? mib : 512) / 512))  # the limits are for 512 MiB: more, in proportion
    [[ $steps == *" $name "* ]] || return 0
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "$name: rc $rc in $((SECONDS - t0)) s (limit $limit s)"
}

{
    nproc
    lscpu | grep -E 'Model name|Thread|Core|Socket' || true
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
    python3 -c 'import sys, numpy, h5py, torch; print(sys.version.split()[0], numpy.__version__, h5py.__version__, torch.__version__, torch.cuda.is_available())'
} >"$out/machine.txt" 2>&1
cat "$out/machine.txt"
step scaling 120 python3 multitables_benchmark.py --sections scaling --section-mib "$mib" --repeats "${LENT_REPEATS:-3}" \
    --file "$work/scaling.h5"  # LENT_REPEATS: fewer rounds, for the test that runs the steps here
step probe 75 python3 benchmarks/scaling_probe.py --dir "$work/probe" --mib $((mib / 2)) --procs 8 16 --json "$out/probe.json"
if [ -d .devrun/before/multitables ]; then  # a checkout's package to compare with (carried: git archive REV multitables)
    PYTHONPATH="$PWD/.devrun/before:$PYTHONPATH" step probe-before 75 \
        python3 benchmarks/scaling_probe.py --dir "$work/probe" --mib $((mib / 2)) --procs 8 16 --json "$out/probe-before.json"
fi
step gpu 60 python3 multitables_benchmark.py --sections gpu --section-mib "$mib" --file "$work/gpu.h5"
# The gpu step's own step length, for the steps after it, so that their rows with the step compare with its (each
# package's rate would size its own).
step_ms=$(grep -o 'a step of [0-9.]* ms' "$out/gpu.log" 2>/dev/null | grep -o '[0-9.]*' | head -1)
if [ -d .devrun/before/multitables ]; then  # the same with the carried older package, started outside the checkout
    (cd "$work" && PYTHONPATH="$OLDPWD/.devrun/before:$PYTHONPATH" step gpu-before 60 python3 -c \
        'import sys, multitables; print(multitables.__file__); from multitables_bench.cli import main; main()' \
        --sections gpu --section-mib "$mib" --file "$work/gpu.h5" ${step_ms:+--gpu-step-ms "$step_ms"})
fi
step batches 60 python3 benchmarks/batches_profile.py --file "$work/gpu.h5" --mib "$mib" --device cuda
# CPU-only batches with a quarter fewer readers: on the H100, 16 readers and 4 copy threads (20 threads on 16 CPUs)
# gave 3.56 GB/s, 2 copy threads 4.05, 1 thread 3.71 (the consumer busy all the time only with 1).
step batches-readers 45 python3 benchmarks/batches_profile.py --file "$work/gpu.h5" --mib "$mib" --procs $(($(nproc) * 3 / 4))
if [ -d .devrun/before/multitables ]; then  # the GPU section's CPU-only loop, this package and the carried one in turn
    step batches-before 60 python3 benchmarks/ab_batches.py --file "$work/gpu.h5" --mib "$mib" --packages .devrun/before . \
        --rounds 3
fi
# Batches into GPU memory against the stream of the same readers, alternated over rounds, with the variants
# (more slots, one reader fewer): batches' measures each once, 0.12-0.15 s, and swung 0.86-0.95 on the H200.
step device-ratio 60 python3 benchmarks/device_ratio.py --file "$work/gpu.h5" --mib "$mib" --rounds 5 --passes 8
# Where a window's first batch waits on the device= path: the host's time in each call that can block it.
step window-waits 45 python3 benchmarks/window_waits.py --file "$work/gpu.h5" --mib "$mib" --epochs 6 ${step_ms:+--step-ms "$step_ms"}
# The consumer's CPU at an epoch's start against mid-epoch (the machine's copy threads make the windows' orders).
step epoch-start 45 python3 benchmarks/epoch_start.py --file "$work/gpu.h5" --mib "$mib"
# The same with as many pieces as an epoch of 100 GiB in 4 MiB blocks (at 512), batch by batch.
step epoch-scale 45 python3 benchmarks/epoch_scale.py --file "$work/pieces.h5" --pieces $((mib * 50)) --epochs 3
step cuda-tests 60 python3 -m pytest -q -p no:cacheprovider tests/test_torch_device.py tests/test_cuda.py
# Starting 16 readers: the probe's zlib file, or else the GPU section's (its rows are /X).
started=("$work/probe/probe-zlib-3-$((mib / 2)).h5")
[ -f "${started[0]}" ] || started=("$work/gpu.h5" --path /X)
step startup 30 python3 benchmarks/stream_startup.py "${started[@]}" --procs 16 --repeats 5
if [ -d .devrun/before/multitables ]; then  # the same start with the carried older package
    PYTHONPATH="$PWD/.devrun/before:$PYTHONPATH" step startup-before 30 \
        python3 benchmarks/stream_startup.py "${started[@]}" --procs 16 --repeats 5
fi
step startup-forkserver 30 python3 benchmarks/stream_startup.py "${started[@]}" --procs 16 --repeats 5 --start-method forkserver
step start-methods 60 python3 benchmarks/start_methods.py "${started[@]}" --procs 16 --hold-mib 4096 --repeats 3
# The device tool brings back at most 8 files: every log and JSON in one archive (tar -xzf OUT/logs.tgz).
shopt -s nullglob
(cd "$out" && logs=(*.log *.json) && tar -czf logs.tgz --remove-files -- "${logs[@]}")
