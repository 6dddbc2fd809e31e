#!/bin/bash
set -e
A=/work/main/data/imports/aiperf; I=/work/main/data/imports/inference_perf; F=/work/clientrun/final
rm -rf $A/aiperf_* $I/ip_*
for R in aiperf_c4_p64_o32 aiperf_n24_c4_p64_o32_raw aiperf_n24_c2_p128_o16; do
  mkdir -p $A/$R; cp -a /work/clientrun/aiperf/$R/. $A/$R/
  cp $F/$R.stdout.log $A/$R/aiperf_stdout.log
  cp /work/clientrun/${R}_server_trace.json.gz $A/$R/server_trace.json.gz
  cp /work/clientrun/${R}_server.log $A/$R/server.log
done
for R in ip_rate4_p64_o32 ip_conc2_n12_p128_o16; do
  mkdir -p $I/$R; cp -a /work/clientrun/ip/$R/. $I/$R/
  cp /work/clientrun/ip/$R.yaml $I/$R/$R.yaml
  cp $F/$R.stdout.log $I/$R/inference_perf_stdout.log
  cp /work/clientrun/${R}_server_trace.json.gz $I/$R/server_trace.json.gz
  cp /work/clientrun/${R}_server.log $I/$R/server.log
done
mkdir -p $A/scripts $I/scripts
rm -f $A/*.sh $I/*.sh
cp /work/clientrun/aiperf/run.sh $A/scripts/aiperf_run.sh
for d in $A $I; do cp /work/clientrun/start_server.sh /work/clientrun/stop_server.sh /work/clientrun/run_all.sh /work/clientrun/bundle.sh $d/scripts/; cp $F/runs_log.txt $d/runs_log.txt; done
find $A $I -type f -exec chmod 644 {} \;
find $A $I -type f -size +300k -printf "TOO BIG %s %p\n"
du -sb $A $I
