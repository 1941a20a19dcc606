#!/bin/bash
# usage: queue.sh MODE(quick|full) KIND(case|control) OP NAME ...   (one sanitizer at a time, niced)
cd /work/main
R=results/cpu/hostile_round6
mode=$1; shift
for spec in "$@"; do
  kind=${spec%%:*}; rest=${spec#*:}; op=${rest%%/*}; name=${rest#*/}
  dir=cases; [ "$kind" = control ] && dir=controls
  flag=--quick; [ "$mode" = full ] && flag=
  log=$R/logs/${op}__${name}.${kind}_${mode}.txt
  start=$(date +%s)
  TRITON_INTERPRET=1 nice -n 10 .venv/bin/kernel-agent sanitize $flag --op $op $R/$dir/$op/$name.py > $log 2>&1
  echo "rc=$? wall_s=$(( $(date +%s) - start ))" >> $log
  echo "$kind $op/$name $mode: $(tail -1 $log)"
done
