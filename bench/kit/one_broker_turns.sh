#!/bin/bash
# One broker alone on cpu 1 (as the kit's cluster scenario starts it), QoS 1 publishers with 64 in flight
# from kitload, 96 then 48 of them, the load on two CPU sets (A, B), eight runs in turns: whether the
# publishers' count, where the load runs, or the machine's speed over the minute moves one broker's rate.
#   cp bench/kit/*.sh .bigbench/ && cd .bigbench && OUT=/tmp/turns bash one_broker_turns.sh
set -u
K=$(cd "$(dirname "$0")" && pwd); OUT=${OUT:-/tmp/layout}; mkdir -p "$OUT"
. "$K/kit_broker.sh"
kit_python
T=8; [ -n "${KIT_LOCAL:-}" ] && T=2
PORT=24883
one() {  # LOADCPUS P
  PORT=$((PORT + 10)); local d; d=$(mktemp -d /tmp/lay.XXXXXX)
  start_kit_broker "$d" "$PORT" -m broker_edge.runtime.main
  local bp=$BROKER_PID
  timeout 60 taskset -c "$1" "$PY" "$K/kitload.py" --ports "$PORT" --pid "$bp" -P "$2" -W 64 -S 100 --duration $T --warmup 2 \
    --procs 6 --topic-fmt 'cl/{i}' --prefix cs --label "load on $1, P $2" 2>"$d/load.err" | tail -1 >>"$OUT/layout.jsonl"
  kill -TERM "$bp"; wait "$bp"
  echo "load on $1, P $2: $(tail -1 "$OUT/layout.jsonl" | "$PY" -c 'import json,sys; d=json.loads(sys.stdin.read()); print(d["acked_per_s"], d["cpu"]["broker_cores"])')"
  rm -rf "$d"
}
A=${A:-0,5-15}; B=${B:-0,8-15}
one "$A" 96; one "$B" 96; one "$A" 48; one "$B" 48; one "$B" 96; one "$A" 96; one "$B" 48; one "$A" 48
