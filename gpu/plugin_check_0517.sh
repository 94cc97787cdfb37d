#!/bin/bash
# H200: the plugin on the post-refactor path (SGLang 0.5.17) through the real planner: a racy
# and a fixed first load, a racy build's folder renamed to the fixed build's name (the loader
# compiles the fixed .so beside the old one: verify and the JIT-load line both say fixed), and
# enforce at JIT load when the racy kernel and its build come back between start and first load.
# Carry a folder P (default .gpu/p17): apache-tvm-ffi 0.1.11 cp312, the sglang 0.5.17 wheel, small/
# (cp312 wheels of SGLang's small import-chain packages and unidiff; each installed only if missing). Writes $OUT/*.
set -u
P=${P:-.gpu/p17} L=sglang.kernels.ops.attention.dsv4.compress
rm -rf /tmp/sp /tmp/tvmcache /tmp/self /tmp/site /tmp/racybuild
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $P/apache_tvm_ffi-0.1.11-cp312*.whl || exit 9
for w in $P/small/*.whl; do
  m=$(python3 -c 'import sys, zipfile; n = zipfile.ZipFile(sys.argv[1]).namelist(); print(next((x.split("/")[0] for x in n if x.count("/") == 1 and x.endswith("/__init__.py")), ""))' "$w")
  if [ -n "$m" ] && ! python3 -c "import $m" 2>/dev/null; then python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$w"; echo "carried: $(basename $w)"; fi
done
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/self . || exit 9
mkdir -p /tmp/sp && python3 -m zipfile -e $P/sglang-0.5.17-*.whl /tmp/sp || exit 9
export PYTHONPATH=/tmp/self:/tmp/sp:/tmp/site TVM_FFI_CACHE_DIR=/tmp/tvmcache PYTHONUNBUFFERED=1
export SGLANG_DSV4_FIX_REPORT=$OUT/report.jsonl
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
echo "== 1. racy 0.5.17 tree, warn: first planner call"; python3 gpu/plugin_check.py $OUT/racy.json $L
R=$(ls -d /tmp/tvmcache/*/); echo "racy build: $R"
echo "== 2. apply --no-clear-cache; keep the racy build aside"
(cd /tmp && python3 -m sglang_dsv4_fix apply --tree /tmp/sp --no-clear-cache); echo "apply rc=$?"
cp -r "$R" /tmp/racybuild2 && mv "$R" /tmp/racybuild
echo "== 3. patched, warn: first planner call (no-init build)"; python3 gpu/plugin_check.py $OUT/noinit.json $L
F=$(ls -d /tmp/tvmcache/*/); echo "no-init build: $F"
echo "== 4. the racy build put under the fixed build's name (a restored cache); verify says:"
rm -rf "$F" && mv /tmp/racybuild "${F%/}"
(cd /tmp && python3 -m sglang_dsv4_fix verify --tree /tmp/sp); echo "verify rc=$?"
echo "== 5. enforce: start passes; the loader compiles the fixed module's .so in that folder"
SGLANG_DSV4_FIX_MODE=enforce python3 gpu/plugin_check.py $OUT/enforce.json $L; echo "rc=$?"
echo "== 6. enforce, cache cleared: start passes; before the first planner call the kernel is"
echo "   reverted and its racy build comes back (a shared cache volume): the JIT load refuses"
(cd /tmp && python3 -m sglang_dsv4_fix clear-cache --tree /tmp/sp --all --cache-dir /tmp/tvmcache); echo "clear-cache rc=$?"
printf '%s\n' "cd /tmp && python3 -m sglang_dsv4_fix revert --tree /tmp/sp --no-clear-cache" \
  "mv /tmp/racybuild2 ${R%/}" > /tmp/before_load.sh
PLUGIN_CHECK_BEFORE_LOAD=/tmp/before_load.sh SGLANG_DSV4_FIX_MODE=enforce \
  python3 gpu/plugin_check.py $OUT/enforce_jit.json $L; echo "rc=$?"
