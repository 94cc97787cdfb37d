#!/bin/bash
# H200: the plugin's JIT-load report under SGLang's real loader (0.5.16), three processes:
# racy tree (first build), after `apply` (no-init, first build), again (no-init, from cache).
# Carry .whl (apache-tvm-ffi 0.1.11 cp312 + .whl/plugin: SGLang's small import-chain packages
# the box lacks, and unidiff) and .jitwhl (the sglang 0.5.16 wheel). Writes $OUT/*.
set -u
rm -rf /tmp/sp /tmp/tvmcache /tmp/self /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
  .whl/apache_tvm_ffi-0.1.11-cp312*.whl .whl/plugin/*.whl || exit 9
# this package pip-installed, so that its entry point is where importlib.metadata looks
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/self . || exit 9
mkdir -p /tmp/sp && python3 -m zipfile -e .jitwhl/sglang-0.5.16-*.whl /tmp/sp || exit 9
export PYTHONPATH=/tmp/self:/tmp/sp:/tmp/site TVM_FFI_CACHE_DIR=/tmp/tvmcache PYTHONUNBUFFERED=1
export SGLANG_DSV4_FIX_REPORT=$OUT/report.jsonl
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
echo "== 1. racy 0.5.16 tree: first planner call"; python3 gpu/plugin_check.py $OUT/racy.json
ls /tmp/tvmcache
echo "== 2. apply"; (cd /tmp && python3 -m sglang_dsv4_fix apply --tree /tmp/sp); echo "apply rc=$?"
ls /tmp/tvmcache
echo "== 3. patched: first planner call"; python3 gpu/plugin_check.py $OUT/noinit_first.json
echo "== 4. patched: again (from cache)"; python3 gpu/plugin_check.py $OUT/noinit_cached.json
ls -la /tmp/tvmcache/*
cat /tmp/tvmcache/*/.sglang-dsv4-fix.json | tee $OUT/sidecar.json
echo "== 5. enforce on the patched tree"; SGLANG_DSV4_FIX_MODE=enforce python3 gpu/plugin_check.py $OUT/enforce.json; echo "rc=$?"
