# usage: ARMS="install:module ..." bash abrun5.sh PAIRS > out  (cached-build tree)
S=~/.cache/sglang-dsv4-fix/venvs
for i in $(seq $1); do
  for arm in $ARMS; do inst=${arm%%:*}; mod=${arm#*:}
   ms=$(env -u PYTHONDONTWRITEBYTECODE TVM_FFI_CACHE_DIR=/tmp/p/warm PYTHONHASHSEED=0 PYTHONPATH=/tmp/p/$inst:/tmp/p/fixed:$S/server-6009b4d666bb3535 $S/base-py3.11-925e25f5a8775abe/bin/python /tmp/p/ab.py $mod 2>/dev/null | grep MS | cut -d' ' -f2)
   echo "$inst-$mod $ms"
  done
done
