#!/usr/bin/env bash
# All GPU evidence for issue 5 in ONE device call (H200, no internet there).
#   bash gpu/run_evidence.sh [smoke|full]
# Needs, carried beside the repo: .whl/ (apache-tvm-ffi 0.1.11, cp312 manylinux wheel) and .gpu/<release>/
# (sglang/jit_kernel/{include,csrc/deepseek_v4} + dist-info of 0.5.12, 0.5.13, 0.5.15, 0.5.16, extracted
# from the PyPI wheels). Raw JSON and logs go to $OUT; a short table is printed last.
set -uo pipefail
mode=${1:-full}
OUT=${OUT:-/tmp/sglang-dsv4-fix-evidence}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
BD=/tmp/sglang-dsv4-fix-builds  # builds shared by the invocations below (ninja: built once)

{
  nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.max.sm --format=csv,noheader
  nvcc --version | tail -2
  compute-sanitizer --version | head -2
  python3 -c 'import torch, tvm_ffi; print("torch", torch.__version__, "cuda", torch.version.cuda, "tvm_ffi", tvm_ffi.__version__)'
} 2>&1 | tee "$OUT/env.txt"

trees=()
for r in 0.5.12 0.5.13 0.5.15 0.5.16; do trees+=(--tree ".gpu/$r"); done
if [ "$mode" = smoke ]; then
  trees=(--tree .gpu/0.5.16)
  A_ITERS=2000; B_ITERS=0; SHAPES=4x72+3x24,4x1023+3
else
  A_ITERS=${A_ITERS:-2000}; B_ITERS=${B_ITERS:-10000}; SHAPES=${SHAPES:-}
fi
shape_args=(); [ -n "$SHAPES" ] && shape_args=(--shapes "$SHAPES")

# A: every variant, racecheck per variant, kernel0 latency, A_ITERS calls per shape.
start=$(date +%s)
python3 -m sglang_dsv4_fix repro "${trees[@]}" "${shape_args[@]}" --iters "$A_ITERS" --racecheck --bench \
  --build-dir "$BD" --save "$OUT/repro_all.json" > "$OUT/repro_all.txt" 2>> "$OUT/repro.log"
echo "A: rc=$? $(( $(date +%s) - start )) s" | tee -a "$OUT/env.txt"

# B: fixed variants only, B_ITERS calls per shape (>= 10,000: the bar for 'no bad plan'), one
# invocation per release so a run cut short keeps what it finished; calls spread over 8 CUDA streams.
if [ "$B_ITERS" -gt 0 ]; then
  for r in 0.5.12 0.5.13 0.5.15 0.5.16; do
    start=$(date +%s)
    python3 -m sglang_dsv4_fix repro --tree ".gpu/$r" "${shape_args[@]}" --variants barrier,no-init \
      --iters "$B_ITERS" --streams "${STREAMS:-8}" --build-dir "$BD" --save "/tmp/fixed_$r.json" \
      >> "$OUT/repro_fixed.txt" 2>> "$OUT/repro.log"
    echo "B $r: rc=$? $(( $(date +%s) - start )) s" | tee -a "$OUT/env.txt"
    # $OUT takes at most 8 files: one JSON line per release.
    python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))))' "/tmp/fixed_$r.json" \
      >> "$OUT/repro_fixed.jsonl"
  done
fi

cat "$OUT/repro_all.txt"
[ -f "$OUT/repro_fixed.txt" ] && grep -E '^0\.5\.[0-9]+ (barrier|no-init):' "$OUT/repro_fixed.txt"
cat "$OUT/env.txt"
