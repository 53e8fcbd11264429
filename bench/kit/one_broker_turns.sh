#!/bin/bash
# One broker alone on cpu 1 (as the kit's cluster scenario starts it), QoS 1 publishers with 64 in flight
# from kitload, 96 then 48 of them, the load on two CPU sets (A, B), eight runs in turns: whether the
# publishers' count, where the load runs, or the machine's speed over the minute moves one broker's rate.
#   cp bench/kit/*.sh .bigbench/ && cd .bigbench && OUT=/tmp/turns bash one_broker_turns.sh
set -u
K=$(cd "$(dirname "$0")" && pwd); OUT=${OUT:-/tmp/layout}; mkdir -p "$OUT"
if [ -n "${KIT_LOCAL:-}" ]; then PY="$(cat "$K/src/CHECKOUT")/.venv/bin/python"; export PYTHONPATH=$K/src:$K; T=2
else PY=python3; timeout 150 $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$K"/wheels/*.whl >"$OUT/pip.log" 2>&1 || exit 3
  export PYTHONPATH=/tmp/site:$K/src:$K; T=8; fi
ulimit -n 65536 2>/dev/null || ulimit -n 20000
PORT=24883
one() {  # LOADCPUS P
  PORT=$((PORT + 10)); local d; d=$(mktemp -d /tmp/lay.XXXXXX)
  printf 'listeners:\n  - {name: default, type: tcp, host: 127.0.0.1, port: %s}\nstorage:\n  directory: %s/data\noffsets_api: {port: %s}\nadmin_http: {port: %s}\nlimits:\n  max_connections: 100000\n  new_connections_per_second: 0\n  messages_per_second_per_client: 0\n  max_topics_per_client: 0\n  max_topics_per_identity: 0\n  max_offline_messages: 1000000\n  max_offline_bytes: 1073741824\n  outgoing_buffer_bytes: 268435456\nlogging:\n  level: WARNING\n' \
    "$PORT" "$d" $((PORT + 1)) $((PORT + 2)) >"$d/b.yaml"
  (cd "$d" && exec taskset -c 1 "$PY" -m broker_edge.runtime.main --config "$d/b.yaml") >"$d/broker.log" 2>&1 &
  local bp=$! i
  for i in $(seq 1 100); do (echo >/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
  timeout 60 taskset -c "$1" "$PY" "$K/kitload.py" --ports "$PORT" --pid "$bp" -P "$2" -W 64 -S 100 --duration $T --warmup 2 \
    --procs 6 --topic-fmt 'cl/{i}' --prefix cs --label "load on $1, P $2" 2>"$d/load.err" | tail -1 >>"$OUT/layout.jsonl"
  kill -TERM "$bp"; wait "$bp"
  echo "load on $1, P $2: $(tail -1 "$OUT/layout.jsonl" | "$PY" -c 'import json,sys; d=json.loads(sys.stdin.read()); print(d["acked_per_s"], d["cpu"]["broker_cores"])')"
  rm -rf "$d"
}
A=${A:-0,5-15}; B=${B:-0,8-15}
one "$A" 96; one "$B" 96; one "$A" 48; one "$B" 48; one "$B" 96; one "$A" 96; one "$B" 48; one "$A" 48
