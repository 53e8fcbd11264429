#!/bin/bash
# Where one broker's CPU goes per message at full speed, on the many-core machine the kit runs on: a broker
# at a time under bench/cpu_samples.py (pinned to cpu 1, as the kit pins its brokers), the kit's load
# generators on cpus 4-15, in the kit's shapes (fan-in at 4 and 16 QoS 1 publishers, the cluster scenario's
# one broker with 48 and 96 publishers, the fleet). OUT gets loads.jsonl (each load's result) and <tag>.txt
# (collapsed stacks: python -m bench.cpu_samples --report reads them renamed cpu-<tag>.txt).
#   cp bench/cpu_samples.py bench/kit/*.sh .bigbench/ && cd .bigbench && OUT=/tmp/prof bash cpu_profile.sh
# KIT_LOCAL=1 runs it tiny with the checkout's .venv (a check that it works, not a measure).
set -u
K=$(cd "$(dirname "$0")" && pwd); OUT=${OUT:-/tmp/profout}; mkdir -p "$OUT"
LOAD=${LOAD_CPUS:-4-15}; SMALL=${SMALL:-0}
. "$K/kit_broker.sh"
kit_python
[ -n "${KIT_LOCAL:-}" ] && { LOAD=${LOAD_CPUS:-1}; SMALL=1; }
PORT=23883
one() {  # TAG LOADER ARGS...
  local tag=$1; shift; PORT=$((PORT + 10)); local d; d=$(mktemp -d /tmp/prof.XXXXXX)
  start_kit_broker "$d" "$PORT" "$K/cpu_samples.py" "$d/samples" broker
  local bp=$BROKER_PID
  local loader=$1; shift
  timeout 90 taskset -c "$LOAD" "$PY" "$K/$loader" "$@" --port$( [ "$loader" = kitload.py ] && echo s) "$PORT" --pid "$bp" --label "$tag" 2>"$d/load.err" | tail -1 >"$d/load.json"
  cat "$d/load.json" >>"$OUT/loads.jsonl"
  kill -INT "$bp"; wait "$bp"
  cat "$d"/samples/cpu-*.txt >"$OUT/$tag.txt" 2>/dev/null
  echo "$tag: $(head -c 200 "$d/load.json") samples $(awk '{s+=$NF} END {print s}' "$OUT/$tag.txt")"
  [ -s "$OUT/$tag.txt" ] || { tail -5 "$d/broker.log"; tail -5 "$d/load.err"; }
  rm -rf "$d"
}
M1=25000; P48=48; P96=96; FP=10000; T=8
[ "$SMALL" = 1 ] && { M1=3000; P48=8; P96=16; FP=300; T=3; }
one fanin4 mqttload.py fanin -P 4 -M $M1 -S 64 --qos 1 --procs 4 --timeout 60 --idle 2
one fanin16 mqttload.py fanin -P 16 -M $M1 -S 64 --qos 1 --procs 4 --timeout 60 --idle 2
one single48 kitload.py -P $P48 -W 64 -S 100 --duration $T --warmup 2 --procs 6 --topic-fmt 'cl/{i}' --prefix cs
one single96 kitload.py -P $P96 -W 64 -S 100 --duration $T --warmup 2 --procs 6 --topic-fmt 'cl/{i}' --prefix cs
one fleet kitload.py -P $FP -W 1 -S 100 --duration $T --warmup 2 --procs 10 --consumer-port $((PORT + 10)) --consumer-filter 'fleet/+/telemetry' --ahead 20000 --prefix fl
