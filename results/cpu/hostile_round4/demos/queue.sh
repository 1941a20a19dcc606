#!/bin/bash
# Runs jobs one at a time from logs/queue.txt (lines: MODE OP FILE; MODE quick|full|guard), appending to
# logs/commands.log; waits while any other sanitizer run is in flight.
cd "$(dirname "$0")/../../../.."
R=results/cpu/hostile_round4
touch $R/logs/queue.txt $R/logs/done.txt
while true; do
  line=$(grep -vxF -f $R/logs/done.txt $R/logs/queue.txt | head -1)
  if [ -z "$line" ]; then sleep 5; continue; fi
  if pgrep -f "kernel-agent sanitize" > /dev/null || pgrep -f "guard_demo.py" > /dev/null; then sleep 5; continue; fi
  set -- $line
  mode=$1; op=$2; file=$3; name=$(basename $file .py); kind=$(echo $file | cut -d/ -f4)
  log=$R/logs/${mode}_${kind}_${op}_${name}.txt
  if [ "$mode" = quick ]; then flag="--quick --timeout 900"; else flag="--timeout 2400"; fi
  cmd="nice -n 15 .venv/bin/kernel-agent sanitize $flag --op $op $file"
  if [ "$mode" = guard ]; then cmd="nice -n 15 .venv/bin/python $R/demos/guard_demo.py $op"; log=$R/logs/guard_${op}.txt; fi
  if [ -s $log ] && grep -qE "file\(s\) passed|^call|installed" $log; then echo "$line" >> $R/logs/done.txt; continue; fi
  echo "$(date -u +%H:%M:%S) $cmd" >> $R/logs/commands.log
  ( time $cmd ) > $log 2>&1
  echo "$(date -u +%H:%M:%S) done $log: $(grep -m1 -E '^(PASS|FAIL)' $log | cut -c1-220)" >> $R/logs/commands.log
  echo "$line" >> $R/logs/done.txt
done
