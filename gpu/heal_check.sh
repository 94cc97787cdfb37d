#!/bin/bash
# H200: SGLANG_DSV4_FIX_MODE=heal on a racy SGLang 0.5.16 tree whose JIT cache holds the racy
# planner build. A warn-mode start builds and loads the racy .so; a restart in heal mode heals the
# kernel and drops that build before SGLang's real planner is called, which then compiles and runs
# the no-init build (the JIT-load line names it); `repro` on the healed tree shows 0 bad.
#   bash gpu/heal_check.sh DIR     (DIR holds whl/: apache-tvm-ffi 0.1.11 cp312, unidiff and
#                                   SGLang 0.5.16's import-chain packages the box lacks; and the
#                                   sglang-0.5.16 wheel; run from this repository's root)
# Writes $OUT/*.
set -u
D=$(cd "${1:?folder with whl/ and the sglang wheel}" && pwd)
OUT=${OUT:-/tmp/heal-check}
mkdir -p "$OUT"
rm -rf /tmp/sp /tmp/tvmcache /tmp/self /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$D"/whl/*.whl || exit 9
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/self . || exit 9
mkdir -p /tmp/sp && python3 -m zipfile -e "$D"/sglang-0.5.16-*.whl /tmp/sp || exit 9
export PYTHONPATH=/tmp/self:/tmp/sp:/tmp/site TVM_FFI_CACHE_DIR=/tmp/tvmcache PYTHONUNBUFFERED=1
export SGLANG_DSV4_FIX_REPORT=$OUT/report.jsonl
cli() { (cd /tmp && python3 -m sglang_dsv4_fix "$@"); }
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
echo "== 1. warn: racy tree, first planner call (the racy build goes into the cache)"
python3 gpu/plugin_check.py "$OUT/racy.json"; ls /tmp/tvmcache
cli verify --tree /tmp/sp; echo "verify rc=$?"
echo "== 2. restart in heal mode: first planner call"
SGLANG_DSV4_FIX_MODE=heal python3 gpu/plugin_check.py "$OUT/heal.json"; echo "heal start rc=$?"
ls /tmp/tvmcache
cat /tmp/sp/sglang/jit_kernel/csrc/deepseek_v4/.c_plan.cuh.sglang-dsv4-fix.json
cli verify --tree /tmp/sp; echo "verify rc=$?"
echo "== 3. repro on the healed tree"
cli repro --tree /tmp/sp --iters "${ITERS:-300}" --save "$OUT/repro.json"; echo "repro rc=$?"
