# shellcheck shell=bash
# Sourced by the run-*.sh conformance scripts (not executable on its own).
# Builds proxops-pvesim (debug) and starts it over HTTPS on a free 127.0.0.1 port.
# After `start_sim <name>`: SIM_PORT, SIM_PID, SIM_LOG are set and an EXIT trap stops it.

SIM_TOKEN_HEADER="PVEAPIToken=root@pam!proxops=proxops-dev-secret"

# free_port PYTHON: prints a port that was free on 127.0.0.1 a moment ago.
free_port() {
  "$1" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

stop_sim() {
  if [[ -n "${SIM_PID:-}" ]] && kill -0 "$SIM_PID" 2>/dev/null; then
    kill "$SIM_PID" 2>/dev/null || true
    wait "$SIM_PID" 2>/dev/null || true
  fi
}

sim_answers() {
  curl -sfk --noproxy '*' --max-time 5 -o /dev/null -H "Authorization: $SIM_TOKEN_HEADER" \
    "https://127.0.0.1:$SIM_PORT/api2/json/version"
}

# start_sim NAME PYTHON [extra simulator args...]
start_sim() {
  local name="$1" python="$2"
  shift 2
  local target_dir="${CARGO_TARGET_DIR:-target}"
  echo "== cargo build -p proxops-pve-sim --bin proxops-pvesim --locked"
  cargo build -p proxops-pve-sim --bin proxops-pvesim --locked
  local sim="$target_dir/debug/proxops-pvesim"
  mkdir -p "$target_dir/conformance"
  SIM_LOG="$target_dir/conformance/pvesim-$name.log"
  SIM_PORT="$(free_port "$python")"
  "$sim" --listen "127.0.0.1:$SIM_PORT" "$@" >"$SIM_LOG" 2>&1 &
  SIM_PID=$!
  trap stop_sim EXIT
  trap 'exit 130' INT TERM
  local _
  for _ in $(seq 1 150); do
    if ! kill -0 "$SIM_PID" 2>/dev/null; then
      echo "proxops-pvesim exited before answering; its log ($SIM_LOG):" >&2
      cat "$SIM_LOG" >&2
      return 1
    fi
    if sim_answers; then
      echo "== proxops-pvesim (pid $SIM_PID) on https://127.0.0.1:$SIM_PORT, log $SIM_LOG"
      return 0
    fi
    sleep 0.2
  done
  echo "proxops-pvesim did not answer https://127.0.0.1:$SIM_PORT within 30s; its log ($SIM_LOG):" >&2
  cat "$SIM_LOG" >&2
  return 1
}

# sim_request_summary PYTHON: prints the simulator's per-endpoint request counters and every
# answer that was not 2xx (from GET /_sim/requests), i.e. what the client really sent.
sim_request_summary() {
  curl -sfk --noproxy '*' --max-time 10 "https://127.0.0.1:$SIM_PORT/_sim/requests" | "$1" -c '
import json, sys
log = json.load(sys.stdin)
print("== requests the client sent (simulator request log):")
for endpoint, n in sorted(log.get("counters", {}).items()):
    print(f"   {n:4d}  {endpoint}")
for r in log.get("requests", []):
    if not 200 <= int(r.get("status", 0)) < 300:
        print("   non-2xx:", r.get("status"), r.get("method"), r.get("path"), r.get("params"))
'
}
