S=~/.cache/sglang-dsv4-fix/venvs
for i in $(seq $1); do
  for arm in $ARMS; do
  ms=$(env -u PYTHONDONTWRITEBYTECODE TVM_FFI_CACHE_DIR=/tmp/p/warm PYTHONHASHSEED=0 PYTHONPATH=/tmp/p/$arm:/tmp/p/fixed:$S/server-6009b4d666bb3535 $S/base-py3.11-925e25f5a8775abe/bin/python /tmp/p/ab.py sglang_dsv4_fix.plugin 2>/dev/null | grep MS | cut -d' ' -f2)
  echo "$arm $ms"
 done
done
