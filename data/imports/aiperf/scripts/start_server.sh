#!/bin/bash
# usage: start_server.sh RUN_NAME
cd /work/main
python -m gpu_runner serve --host 127.0.0.1 --port 8101 --threads 1 --max-seqs 16 --token-budget 2048 --served-model-name tiny --trace-out /work/clientrun/$1_server_trace.json.gz > /work/clientrun/$1_server.log 2>&1 &
echo $! > /work/clientrun/server.pid
for i in $(seq 1 120); do
  code=$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8101/health)
  [ "$code" = "200" ] && echo "up after $i s pid $(cat /work/clientrun/server.pid)" && exit 0
  sleep 1
done
echo "server did not come up"; exit 1
