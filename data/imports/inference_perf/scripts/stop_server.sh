#!/bin/bash
pid=$(cat /work/clientrun/server.pid)
kill -INT $pid
for i in $(seq 1 30); do kill -0 $pid 2>/dev/null || { echo "stopped"; exit 0; }; sleep 1; done
kill $pid; echo "sent TERM"
