#!/bin/bash
# Runs sanitizer jobs one at a time from queue.txt (lines: MODE OP FILE), appending to commands.log.
cd "$(dirname "$0")/../../../.."
R=results/cpu/hostile_round4
touch $R/logs/queue.txt $R/logs/done.txt
while true; do
  line=$(grep -vxF -f $R/logs/done.txt $R/logs/queue.txt | head -1)
  if [ -z "$line" ]; then sleep 5; continue; fi
  set -- $line
  mode=$1; op=$2; file=$3; name=$(basename $file .py); kind=$(echo $file | cut -d/ -f4)
  log=$R/logs/${mode}_${kind}_${op}_${name}.txt
  if [ "$mode" = quick ]; then flag="--quick --timeout 900"; else flag="--timeout 2400"; fi
  cmd="nice -n 15 .venv/bin/kernel-agent sanitize $flag --op $op $file"
  echo "$(date -u +%H:%M:%S) $cmd" >> $R/logs/commands.log
  ( time $cmd ) > $log 2>&1
  echo "$(date -u +%H:%M:%S) done rc=$? $log: $(grep -m1 -E '^(PASS|FAIL|ok|pass)' $log | cut -c1-200)" >> $R/logs/commands.log
  echo "$line" >> $R/logs/done.txt
done
