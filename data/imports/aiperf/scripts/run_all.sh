#!/bin/bash
# Re-runs every bundled client run, one server per run. Writes into /work/clientrun/final/.
set -u
F=/work/clientrun/final; mkdir -p $F
cd /work/clientrun
note() { echo "$(date -u +%FT%TZ) $*" >> $F/runs_log.txt; }
busy() { ps -eo pcpu,comm --sort=-pcpu | head -4 | tail -3 | tr '\n' ';' ; }
run_aiperf() { # RUN N C ISL OSL extra...
  R=$1; shift
  note "START $R load=[$(cut -d' ' -f1-3 /proc/loadavg)] top=[$(busy)]"
  /work/clientrun/start_server.sh $R >/dev/null || { note "server failed $R"; return 1; }
  (cd /work/clientrun/aiperf && timeout 400 ./run.sh $R "$@" > $F/$R.stdout.log 2>&1); rc=$?
  /work/clientrun/stop_server.sh >/dev/null
  note "END $R rc=$rc"
}
run_ip() { # RUN
  R=$1
  note "START $R load=[$(cut -d' ' -f1-3 /proc/loadavg)] top=[$(busy)]"
  /work/clientrun/start_server.sh $R >/dev/null || { note "server failed $R"; return 1; }
  (cd /work/clientrun/ip && timeout 300 /work/venvs/inference-perf/bin/inference-perf -c $R.yaml > $F/$R.stdout.log 2>&1); rc=$?
  /work/clientrun/stop_server.sh >/dev/null
  note "END $R rc=$rc"
}
rm -rf /work/clientrun/aiperf/aiperf_c4_p64_o32 /work/clientrun/aiperf/aiperf_n24_c4_p64_o32_raw /work/clientrun/aiperf/aiperf_n24_c2_p128_o16 /work/clientrun/ip/ip_rate4_p64_o32 /work/clientrun/ip/ip_conc2_n12_p128_o16
run_aiperf aiperf_c4_p64_o32 48 4 64 32
run_aiperf aiperf_n24_c4_p64_o32_raw 24 4 64 32 --export-level raw
run_aiperf aiperf_n24_c2_p128_o16 24 2 128 16 --server-metrics-formats json csv jsonl
run_ip ip_rate4_p64_o32
run_ip ip_conc2_n12_p128_o16
