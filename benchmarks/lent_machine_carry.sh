#!/usr/bin/env bash
# What benchmarks/lent_machine.sh needs carried to a lent machine, made here (needs pip's index):
#
#     bash benchmarks/lent_machine_carry.sh [REV]
#
# .whl/: the wheels the lent machine's Python 3.12 lacks, at the versions installed here: PyTables, hdf5plugin,
# imagecodecs, blosc2, numexpr, ndindex. hdf5plugin's wheel is 46 MB, which with the others passes the 64 MiB a
# call carries: its filters no benchmark writes (sz, sz3, sperr, fcidecomp, htj2k) are taken out (53 MiB left).
# .devrun/before/: REV's package (git archive), for the steps that compare with an older one (probe-before,
# gpu-before, batches-before). Both folders are added to .git/info/exclude. Then, with the device tool:
#
#     run: bash benchmarks/lent_machine.sh $OUT/g 512 gpu gpu-before batches batches-before epoch-start cuda-tests;
#          bash benchmarks/lent_machine.sh $OUT/s 1024 scaling        carry: [".whl", ".devrun/before"]
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-}
for name in /.whl/ /.devrun/; do
    grep -qxF "$name" .git/info/exclude 2>/dev/null || echo "$name" >>.git/info/exclude
done
rm -rf .whl && mkdir .whl
for name in tables hdf5plugin imagecodecs blosc2 numexpr ndindex; do
    version=$(python3 -c "import importlib.metadata as m; print(m.version('$name'))")
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
        -d .whl "$name==$version"
done
python3 - <<'EOF'
import glob, os, zipfile

drop = ("libh5sz3.so", "libh5sz.so", "libh5sperr.so", "libh5fcidecomp.so", "libh5htj2k.so")
(path,) = glob.glob(".whl/hdf5plugin-*.whl")
with zipfile.ZipFile(path) as src, zipfile.ZipFile(path + ".part", "w", zipfile.ZIP_DEFLATED) as dst:
    for item in src.infolist():
        if item.filename.endswith(drop):
            continue
        data = src.read(item.filename)
        if item.filename.endswith("/RECORD"):  # pip rewrites RECORD; the dropped files must not be listed
            data = b"\n".join(line for line in data.split(b"\n") if not any(d.encode() in line for d in drop))
        dst.writestr(item, data)
os.replace(path + ".part", path)
EOF
if [ -n "$rev" ]; then
    rm -rf .devrun/before && mkdir -p .devrun/before && git archive "$rev" multitables | tar -x -C .devrun/before
fi
du -sh .whl ${rev:+.devrun/before}
