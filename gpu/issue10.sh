#!/usr/bin/env bash
# The plugin on the H200 host, in ONE device call: gpu/plugin_check_0517.sh (0.5.17 through the
# real planner: racy and fixed loads, a renamed racy build folder, enforce at JIT load), then the
# plugin's start cost on this host's CPUs (gpu/plugin_cost.py, 0.5.16, three arms, three trees).
#
#   bash gpu/issue10.sh prep     # here (CPU, with internet): lay out .gpu/p17 (ignored, carried)
#   bash gpu/issue10.sh run      # on the H200: carry .gpu/p17; results under $OUT
set -uo pipefail
P=.gpu/p17
SMALL=(annotated_types==0.7.0 asttokens==3.0.1 executing==2.2.1 ipython==9.18.1 jedi==0.19.2
       matplotlib_inline==0.2.1 msgspec==0.23.0 orjson==3.13.0 parso==0.8.5 pexpect==4.9.0
       prompt_toolkit==3.0.52 ptyprocess==0.7.0 pure_eval==0.2.3 pybase64==1.5.1 pydantic==2.14.4
       pydantic_core pyzmq==27.3.0 stack_data==0.6.3 starlette==1.10.0 traitlets==5.14.3
       typing_inspection==0.4.2 unidiff==1.0.1 wcwidth==0.2.14)

prep() {
  rm -rf "$P" && mkdir -p "$P/small" || return 9
  python3 - "$P" <<'PY' || return 9
import shutil, sys
sys.path.insert(0, "tests")
from trees import fetch_wheel
for r in ("0.5.16", "0.5.17"):
    shutil.copy(fetch_wheel(r), sys.argv[1])
PY
  local pip=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12
             --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
             --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
             --platform manylinux2014_x86_64)
  "${pip[@]}" -d "$P" apache-tvm-ffi==0.1.11 || return 9
  "${pip[@]}" -d "$P/small" "${SMALL[@]}" || return 9
  du -sh "$P"
}

run() {
  mkdir -p "$OUT"
  P=$P bash gpu/plugin_check_0517.sh > "$OUT/plugin_check_0517.log" 2>&1
  echo "plugin_check_0517 rc=$?"
  grep -E "^== |rc=|sglang-dsv4-fix: (JIT|refusing)|REFUSED|plan_error|VERIFIED" "$OUT/plugin_check_0517.log" | cut -c1-260
  cost
}

# The start cost alone (a probe imports torch: ~5 s each on this host, so few rounds).
cost() {
  local here=$PWD
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
  (cd /tmp && PYTHONPATH=/tmp/self:/tmp/site timeout "${COST_S:-420}" python3 "$here/gpu/plugin_cost.py" \
     /tmp/self /tmp/sp16 /tmp/site "${ROUNDS:-4}" "${BUDGET_S:-}") 2>&1 | tee "$OUT/plugin_cost.txt"
}

"$@"
