#!/usr/bin/env bash
# GPU evidence, second pass (issue 12): every affected kernel at its release's own build target,
# the serving-like grid, the original's evidence-only bad count, a fork's unknown-base fix against
# its release's fix, and `pytest -m gpu` -- in ONE device call; a short table is printed last.
#
#   bash gpu/evidence2.sh prep DEST   # here (CPU, with internet): lay out DEST for the device
#   bash DEST/repo/gpu/evidence2.sh run   # on the H200 (no internet); raw results under $OUT
#
# DEST holds: repo/ (this checkout's package, patches as sglang_dsv4_fix.patches, tests, gpu/),
# trees/<release>/ (each release's kernel, loader and dist-info, unpacked from the PyPI wheel),
# wheels/ (the sglang wheels the GPU tests unpack) and whl/ (cp312 apache-tvm-ffi, unidiff, GitPython).
set -uo pipefail
RELEASES=(0.5.12 0.5.13 0.5.15 0.5.16)  # the distinct affected kernels (FACTS.md)
TVM_FFI=0.1.11

prep() {
  local dest=$1 here
  here=$(cd "$(dirname "$0")/.." && pwd)
  rm -rf "$dest" && mkdir -p "$dest"/{repo,trees,wheels,whl} || return 9
  (cd "$here" && cp -r sglang_dsv4_fix tests gpu pyproject.toml "$dest/repo/") || return 9
  cp -r "$here/patches" "$dest/repo/sglang_dsv4_fix/patches" || return 9
  find "$dest/repo" -name __pycache__ -prune -exec rm -rf {} +
  python3 - "$dest" "$here/tests" "${RELEASES[@]}" <<'EOF' || return 9
import shutil, sys
from pathlib import Path
dest, tests, releases = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
sys.path.insert(0, tests)
from trees import extract, fetch_wheel
for r in releases:
    extract(r, dest / "trees" / r)
for r in ("0.5.12", "0.5.16"):  # what tests/test_harness_gpu.py unpacks
    shutil.copy(fetch_wheel(r), dest / "wheels")
EOF
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$dest/whl" "apache-tvm-ffi==$TVM_FFI" unidiff==1.0.1 GitPython==3.2.1 gitdb==4.0.12 smmap==5.0.3 || return 9
  du -sh "$dest"
}

run() {
  local D R W BD T T0 BUDGET lim left start
  D=$(cd "$(dirname "$0")/../.." && pwd) R=$D/repo W=/tmp/evidence2 BD=/tmp/evidence2-builds
  OUT=${OUT:-/tmp/evidence2-out} T="python3 -m sglang_dsv4_fix"
  T0=$(date +%s) BUDGET=${BUDGET_S:-540}  # the whole run ends inside the device's 600 s per call
  rm -rf "$W" /tmp/evidence2-fork /tmp/evidence2-rel16 && mkdir -p "$W" "$OUT"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/evidence2-site "$D"/whl/*.whl || return 9
  export PYTHONPATH="/tmp/evidence2-site:$R" PYTHONUNBUFFERED=1
  cd "$R" || return 9
  {
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.max.sm --format=csv,noheader
    nvcc --version | tail -2
    compute-sanitizer --version | head -2
    python3 -c 'import torch, tvm_ffi, pytest; print("torch", torch.__version__, "tvm_ffi", tvm_ffi.__version__, "pytest", pytest.__version__)'
  } > "$W/env.txt" 2>&1
  trees=(); for r in "${RELEASES[@]}"; do trees+=(--tree "$D/trees/$r"); done

  # A fork-like tree: 0.5.16 with local edits (a comment, a blank line), patched by apply (unknown
  # base: structural rewrite); the release itself patched by apply (known base: manifest patch).
  cp -r "$D/trees/0.5.16" /tmp/evidence2-fork && cp -r "$D/trees/0.5.16" /tmp/evidence2-rel16
  python3 - /tmp/evidence2-fork <<'EOF'
import sys
from sglang_dsv4_fix.tree import find_tree
k = find_tree(sys.argv[1]).kernel_path
k.write_text("// local fork: site-specific notes\n" + k.read_text().replace("\n\n", "\n\n\n", 1))
EOF
  { $T apply --tree /tmp/evidence2-fork; echo "rc=$?"; $T apply --tree /tmp/evidence2-rel16; echo "rc=$?"; } > "$W/apply.txt" 2>&1

  # 1. alone on the GPU: build all 12 (each at its own target), racecheck each, kernel0 latency.
  start=$(date +%s)
  timeout 300 $T repro "${trees[@]}" --iters 0 --racecheck --bench --build-dir "$BD" --save "$W/step1.json" \
    > "$W/step1.txt" 2> "$W/step1.log"
  echo "step1 rc=$? $(( $(date +%s) - start )) s" >> "$W/env.txt"

  lim=$(( BUDGET - ($(date +%s) - T0) )); [ "$lim" -gt 30 ] || lim=30  # step 2's share
  # 2. in parallel: per release the originals (2,000 calls a shape) then both fixes (10,000 a shape,
  # 8 streams); the fork against the release; the GPU tests.
  start=$(date +%s)
  for r in "${RELEASES[@]}"; do
    (
      timeout "$lim" $T repro --tree "$D/trees/$r" --variants original --iters 2000 --build-dir "$BD" \
        --save "$W/original_$r.json" > "$W/original_$r.txt" 2> "$W/original_$r.log"
      echo "original $r rc=$? $(( $(date +%s) - start )) s" >> "$W/env.txt"
      left=$(( lim - ($(date +%s) - start) )); [ "$left" -gt 0 ] || left=1
      timeout "$left" $T repro --tree "$D/trees/$r" --variants barrier,no-init \
        --iters 10000 --streams 8 --build-dir "$BD" --save "$W/fixed_$r.json" > "$W/fixed_$r.txt" 2> "$W/fixed_$r.log"
      echo "fixed $r rc=$? $(( $(date +%s) - start )) s" >> "$W/env.txt"
    ) &
  done
  (
    timeout "$lim" $T repro --tree /tmp/evidence2-fork --variants no-init --compare-with /tmp/evidence2-rel16 --iters 3000 \
      --racecheck --build-dir "$BD-fork" --save "$W/fork.json" > "$W/fork.txt" 2> "$W/fork.log"
    echo "fork rc=$? $(( $(date +%s) - start )) s" >> "$W/env.txt"
  ) &
  (
    SGLANG_DSV4_FIX_WHEEL_CACHE="$D/wheels" timeout "$lim" python3 -m pytest -m gpu -p no:cacheprovider \
      -q tests > "$W/pytest.txt" 2>&1
    echo "pytest rc=$? $(( $(date +%s) - start )) s" >> "$W/env.txt"
  ) &
  wait
  tar -czf "$OUT/evidence2.tar.gz" -C "$W" .
  python3 gpu/evidence2_table.py "$W" | tee "$OUT/table.txt"
}

# The second call: 0.5.12's original at its own target (sm_90) faulted the GPU (illegal memory
# access) mid-grid in the first call, so it runs again, one process per stretch of the grid, each
# starting after the shape that faulted the last; and the one shape of 0.5.13's fixed run that the
# first call's time limit cut off.
complete() {
  local D R W BD T T0 ratio rest n
  D=$(cd "$(dirname "$0")/../.." && pwd) R=$D/repo W=/tmp/evidence2 BD=/tmp/evidence2-builds
  OUT=${OUT:-/tmp/evidence2-out} T="python3 -m sglang_dsv4_fix" T0=$(date +%s)
  rm -rf "$W" && mkdir -p "$W" "$OUT"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/evidence2-site "$D"/whl/*.whl || return 9
  export PYTHONPATH="/tmp/evidence2-site:$R" PYTHONUNBUFFERED=1
  cd "$R" || return 9
  date -u +%FT%TZ > "$W/env.txt"
  (
    timeout 150 $T repro --tree "$D/trees/0.5.13" --variants barrier,no-init --ratios 128 \
      --shapes 1x256+2x256+3x256+4x256@1000 --iters 10000 --streams 8 --build-dir "$BD" \
      --save "$W/fixed_0.5.13_rest.json" > "$W/fixed_0.5.13_rest.txt" 2>&1
    echo "fixed 0.5.13 rest rc=$? $(( $(date +%s) - T0 )) s" >> "$W/env.txt"
  ) &
  for ratio in 4 128; do
    rest=$(python3 -c 'from sglang_dsv4_fix.harness import shapes; print(",".join(shapes.DEFAULT_SHAPES))')
    n=0
    while [ -n "$rest" ] && [ $n -lt 6 ] && [ $(( $(date +%s) - T0 )) -lt 150 ]; do
      timeout 120 $T repro --tree "$D/trees/0.5.12" --variants original --iters 2000 --ratios $ratio \
        --shapes "$rest" --build-dir "$BD" --save "$W/original_0.5.12_c${ratio}_$n.json" \
        > "$W/original_0.5.12_c${ratio}_$n.txt" 2>&1
      echo "original 0.5.12 c$ratio part $n rc=$? $(( $(date +%s) - T0 )) s" >> "$W/env.txt"
      rest=$(python3 gpu/evidence2_table.py --after-fault "$W/original_0.5.12_c${ratio}_$n.json" "$rest")
      n=$((n + 1))
    done
  done
  wait
  tar -czf "$OUT/evidence2b.tar.gz" -C "$W" .
  cat "$W/env.txt"; grep -h "faulted\|^0\.5\.1[23] " "$W"/*.txt
}

case ${1:-} in
  prep) prep "${2:?prep DEST}" ;;
  run) run ;;
  complete) complete ;;
  *) echo "usage: $0 prep DEST | run | complete" >&2; exit 2 ;;
esac
