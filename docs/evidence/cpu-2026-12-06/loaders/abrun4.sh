# usage: bash abrun4.sh PAIRS > out; arms: "install:module" pairs in $ARMS, trees racy and fixed
S=~/.cache/sglang-dsv4-fix/venvs
for i in $(seq $1); do
 for tree in fixed racy; do
  site=/tmp/p/fixed; cache=/tmp/p/warm
  [ $tree = racy ] && site=$S/sglang-0.5.16-fec2a79724500153 && cache=/tmp/p/empty
  for arm in $ARMS; do inst=${arm%%:*}; mod=${arm#*:}
   ms=$(env -u PYTHONDONTWRITEBYTECODE TVM_FFI_CACHE_DIR=$cache PYTHONHASHSEED=0 PYTHONPATH=/tmp/p/$inst:$site:$S/server-6009b4d666bb3535 $S/base-py3.11-925e25f5a8775abe/bin/python /tmp/p/ab.py $mod 2>/dev/null | grep MS | cut -d' ' -f2)
   echo "$tree-$inst $ms"
  done
 done
done
