#!/bin/bash
# H200: real 0.5.16 tree; the loader's first build (racy), apply (clears it), prewarm, verify,
# the loader loading the prewarmed build without compiling, then one forced rebuild, timed.
# Run from the repo root on the device with .whl/apache_tvm_ffi-0.1.11-cp312*.whl and
# .jitwhl/{sglang-0.5.16-*.whl,unidiff-*.whl} carried. Writes $OUT/*.json and $OUT/log.
set -u
R=$PWD
rm -rf /tmp/site /tmp/tool /tmp/sp /tmp/tvmcache  # a warm machine keeps /tmp between calls
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
  .whl/apache_tvm_ffi-0.1.11-cp312*.whl .jitwhl/unidiff-*.whl || exit 9
# the tool laid out as installed (patches/ is the package sglang_dsv4_fix.patches, per pyproject)
mkdir -p /tmp/tool && cp -r sglang_dsv4_fix /tmp/tool/ && cp -r patches /tmp/tool/sglang_dsv4_fix/patches || exit 9
export PYTHONPATH=/tmp/site:/tmp/tool TVM_FFI_CACHE_DIR=/tmp/tvmcache PYTHONUNBUFFERED=1
mkdir -p /tmp/sp && python3 -m zipfile -e .jitwhl/sglang-0.5.16-*.whl /tmp/sp
T="python3 -P -m sglang_dsv4_fix"  # -P: the installed layout, not the checkout in cwd
CHECK="env PYTHONPATH=/tmp/sp:$PYTHONPATH python3 $R/gpu/jit_check.py /tmp/sp"
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
echo "== 1. loader on the racy tree (first build)"; $CHECK $OUT/racy_first.json
ls /tmp/tvmcache
echo "== 2. apply"; $T apply --tree /tmp/sp; echo "apply rc=$?"; ls /tmp/tvmcache
echo "== 3. prewarm"; $T prewarm --tree /tmp/sp --json | tee $OUT/prewarm.json
echo "== 4. verify"; $T verify --tree /tmp/sp; echo "verify rc=$?"
$T clear-cache --tree /tmp/sp --dry-run
echo "== 5. loader after prewarm"; $CHECK $OUT/load_prewarmed.json
echo "== 6. full wipe, loader rebuilds"; $T clear-cache --tree /tmp/sp --all
$CHECK $OUT/rebuild.json
ls /tmp/tvmcache
