#!/usr/bin/env bash
# The plugin on the H200 host: gpu/plugin_check_0517.sh (0.5.17 through the real planner: racy
# and fixed loads, a renamed racy build folder, enforce at JIT load) and the GPU tests
# (`pytest -m gpu`), then the plugin's start cost on this host's CPUs (gpu/plugin_cost.py, 0.5.16,
# three arms, three trees).
#
#   bash gpu/issue10.sh prep     # here (CPU, with internet): lay out .gpu/p17 (ignored, carried);
#                                # with BASELINE=<git ref>, also the package as committed there,
#                                # which cost then times as a baseline arm in the same rounds
#   bash gpu/issue10.sh run      # on the H200, carrying .gpu/p17: all of it (one call, when the
#                                # cost run's budget leaves room); results under $OUT
#   bash gpu/issue10.sh check    # the planner checks and the GPU tests alone (~4 min)
#   bash gpu/issue10.sh cost     # the start cost alone
#   bash gpu/issue10.sh floor    # the start modules as one file against as installed
#                                # (benchmarks/start_floor.py --host), after `cost` or alone
set -uo pipefail
P=.gpu/p17
SMALL=(annotated_types==0.7.0 asttokens==3.0.1 executing==2.2.1 ipython==9.18.1 jedi==0.19.2
       matplotlib_inline==0.2.1 msgspec==0.23.0 orjson==3.13.0 parso==0.8.5 pexpect==4.9.0
       prompt_toolkit==3.0.52 ptyprocess==0.7.0 pure_eval==0.2.3 pybase64==1.5.1 pydantic==2.14.4
       pydantic_core pyzmq==27.3.0 stack_data==0.6.3 starlette==1.10.0 traitlets==5.14.3
       typing_inspection==0.4.2 unidiff==1.0.1 wcwidth==0.2.14
       GitPython==3.2.1 gitdb==4.0.12 smmap==5.0.3)  # the last three: the test modules' imports

prep() {
  rm -rf "$P" && mkdir -p "$P/small" "$P/w12" || return 9
  python3 - "$P" <<'PY' || return 9
import shutil, sys
sys.path.insert(0, "tests")
from trees import fetch_wheel
for r in ("0.5.16", "0.5.17"):
    shutil.copy(fetch_wheel(r), sys.argv[1])
shutil.copy(fetch_wheel("0.5.12"), sys.argv[1] + "/w12")  # the GPU tests unpack 0.5.12 and 0.5.16
PY
  local pip=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12
             --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
             --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
             --platform manylinux2014_x86_64)
  "${pip[@]}" -d "$P" apache-tvm-ffi==0.1.11 || return 9
  "${pip[@]}" -d "$P/small" "${SMALL[@]}" || return 9
  if [ -n "${BASELINE:-}" ]; then  # cost's baseline arm: the package as committed at that ref
    git archive --format=tar "$BASELINE" > "$P/baseline.tar" || return 9
  fi
  du -sh "$P"
}

run() {
  check
  cost
}

check() {
  mkdir -p "$OUT"
  P=$P bash gpu/plugin_check_0517.sh > "$OUT/plugin_check_0517.log" 2>&1
  echo "plugin_check_0517 rc=$?"
  grep -E "^== |rc=|sglang-dsv4-fix: (c_plan|JIT|refusing)|REFUSED|plan_error|VERIFIED" "$OUT/plugin_check_0517.log" | cut -c1-260
  tests
}

# `pytest -m gpu` on this checkout (its patches/ beside the package, as in a wheel), with the
# packages plugin_check_0517.sh laid into /tmp/site and the carried 0.5.12 and 0.5.16 wheels.
tests() {
  local wc=/tmp/gpu-wheels
  rm -rf "$wc" && mkdir -p "$wc" && cp "$P"/sglang-0.5.16-*.whl "$P"/w12/sglang-0.5.12-*.whl "$wc" || return 9
  rm -rf /tmp/gpu-repo && mkdir -p /tmp/gpu-repo && cp -r sglang_dsv4_fix tests pyproject.toml /tmp/gpu-repo || return 9
  cp -r patches /tmp/gpu-repo/sglang_dsv4_fix/patches || return 9
  (cd /tmp/gpu-repo && PYTHONPATH=/tmp/gpu-repo:/tmp/site SGLANG_DSV4_FIX_WHEEL_CACHE=$wc \
     timeout "${TESTS_S:-300}" python3 -m pytest -m gpu -p no:cacheprovider -q tests) > "$OUT/pytest_gpu.txt" 2>&1
  echo "pytest -m gpu rc=$?"
  tail -3 "$OUT/pytest_gpu.txt"
}

# The start cost alone (a probe imports torch: ~5 s each on this host, so few rounds).
cost() {
  local here=$PWD
  lay_out || return 9
  local base
  base=$(baseline) || return 9
  (cd /tmp && PYTHONPATH=/tmp/self:/tmp/site COST_BASELINE=$base timeout "${COST_S:-420}" python3 "$here/gpu/plugin_cost.py" \
     /tmp/self /tmp/sp16 /tmp/site "${ROUNDS:-4}" "${BUDGET_S:-}") 2>&1 | tee "$OUT/plugin_cost.txt"
}

# The floor under any merge of the start modules (benchmarks/start_floor.py on this host).
floor() {
  local here=$PWD
  lay_out || return 9
  (cd /tmp && PYTHONPATH=/tmp/self:/tmp/site timeout "${FLOOR_S:-420}" python3 "$here/benchmarks/start_floor.py" \
     --host /tmp/self /tmp/sp16 /tmp/site --rounds "${ROUNDS:-6}") 2>&1 | tee "$OUT/start_floor.txt"
}

# The package as committed at prep's BASELINE, installed afresh beside /tmp/self (a warm machine
# may hold another ref's); prints its folder, or nothing when prep laid out no baseline.
baseline() {
  [ -f "$P/baseline.tar" ] || return 0
  rm -rf /tmp/baseline /tmp/baseline-src && mkdir -p /tmp/baseline-src || return 9
  tar -x -C /tmp/baseline-src -f "$P/baseline.tar" || return 9
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/baseline /tmp/baseline-src >&2 || return 9
  echo /tmp/baseline
}

# What cost and floor probe: this package, the release's extra needs, an unpacked 0.5.16.
lay_out() {
  mkdir -p "$OUT"
  if [ ! -d /tmp/self/sglang_dsv4_fix ]; then  # a fresh machine: lay out what plugin_check_0517.sh does
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$P"/apache_tvm_ffi-*.whl || return 9
    local w m
    for w in "$P"/small/*.whl; do  # only what this host lacks
      m=$(python3 -c 'import sys, zipfile; n = zipfile.ZipFile(sys.argv[1]).namelist(); print(next((x.split("/")[0] for x in n if x.count("/") == 1 and x.endswith("/__init__.py")), ""))' "$w")
      if [ -n "$m" ] && ! python3 -c "import $m" 2>/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$w"
      fi
    done
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/self . || return 9
  fi
  rm -rf /tmp/sp16 && mkdir -p /tmp/sp16 && python3 -m zipfile -e "$P"/sglang-0.5.16-*.whl /tmp/sp16
  nproc; lscpu | grep -E "Model name" | head -1
}

"$@"
