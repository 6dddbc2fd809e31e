# bench/process_groups.sh: sourced by the bench scripts that start servers (bench/vllm_repeats.sh,
# bench/vllm_fleet.sh). Each server is started with setsid and its pid added to PIDS; on exit every
# group gets SIGTERM, then SIGKILL after 30 s.
PIDS=()
stop_group() {
  local pid=$1 i
  kill -0 -- "-$pid" 2>/dev/null || return 0
  kill -TERM -- "-$pid" 2>/dev/null || true
  for i in $(seq 1 60); do kill -0 -- "-$pid" 2>/dev/null || return 0; sleep 0.5; done
  kill -KILL -- "-$pid" 2>/dev/null || true
}
cleanup() { local p; for p in "${PIDS[@]}"; do stop_group "$p"; done; }
trap cleanup EXIT
