#!/bin/bash
# Members on one host against one broker, in turns: the kit's cluster scenario (QoS 1 publishers, 64 in
# flight each, spread over the members; 16 publishers a member) run TURNS times (default 3). Each turn
# measures one broker alone on the first member's cpu and the KIT_MEMBERS members (default 6, a cpu each, as
# the kit places them) at each replication factor of RFS (default "1 3"), the order reversed every other
# turn, so that each member count is divided by a baseline taken within the same minute (the kit measures its
# baseline once, before the members, on a machine whose speed drifts). OUT gets members.jsonl (kitload's
# result of each run, its label naming the turn) and summary.txt: each turn's N members against one broker,
# per member, and the median over the turns beside the targets (0.8 per member at factor 1, 0.3 at factor 3).
#   cp bench/kit/*.sh .bigbench/ && cd .bigbench && OUT=/tmp/members bash members_turns.sh
# About 3 minutes with the defaults. KIT_LOCAL=1 runs it tiny with the checkout's .venv (every broker on one
# core: a check that it works, not a measure).
set -u
K=$(cd "$(dirname "$0")" && pwd); OUT=${OUT:-/tmp/members}; mkdir -p "$OUT"
. "$K/kit_broker.sh"
kit_python
MEMBERS=${KIT_MEMBERS:-6}; TURNS=${TURNS:-3}; RFS=${RFS:-"1 3"}
eval "$("$PY" "$K/kitutil.py" cores "$MEMBERS" 1)"
read -r -a MCPUS <<<"$MEMBER_CPUS"
P=${CL_P:-$((16 * MEMBERS))}; T=8; WARM=2; PROCS=$(( NLOAD > 8 ? 6 : (NLOAD > 2 ? NLOAD - 2 : 1) ))
[ -n "${KIT_LOCAL:-}" ] && { P=${CL_P:-12}; T=2; WARM=1; TURNS=${TURNS_LOCAL:-2}; }
WORK=$(mktemp -d /tmp/members.XXXXXX)
if [ "$(stat -f -c %T "$WORK")" = tmpfs ]; then  # data on a disk, as the kit keeps it: the acks wait for fsync
  rmdir "$WORK"; WORK=$(mktemp -d "$K/.members.XXXXXX")
fi
R="$OUT/members.jsonl"; : >"$R"
STARTED=()
trap 'kill -TERM "${STARTED[@]}" 2>/dev/null; wait; rm -rf "$WORK"' EXIT
PORT=${PORT_BASE:-25883}
start_kit_etcd "$WORK/etcd" "$PORT" $((PORT + 1)) || exit 3
STARTED+=("$ETCD_PID"); EC=$PORT
timeout 60 "$PY" "$K/kitutil.py" mkcerts "$WORK/pki" $(seq -f 'b%g' 1 "$MEMBERS") >"$WORK/certs.txt" \
  || { echo "cannot make member certificates"; exit 3; }
echo "members $MEMBERS (cpus ${MCPUS[*]}), etcd cpu $ETCD_CPU, load on $LOAD_CPUS ($LAYOUT), $P publishers, $TURNS turns, factors $RFS"

load() {  # LABEL PORTS PIDS: the kit's cluster load on LOAD_CPUS, its result appended to R
  timeout $((WARM + T + 90)) taskset -c "$LOAD_CPUS" "$PY" "$K/kitload.py" --ports "$2" --pid "$3" -P "$P" -W 64 -S 100 \
    --duration "$T" --warmup "$WARM" --procs "$PROCS" --topic-fmt 'cl/{i}' --prefix "m$PORT" --label "$1" \
    --out "$R" >/dev/null 2>>"$WORK/load.err"
  echo "$1: $(tail -1 "$R" | "$PY" -c 'import json,sys; d=json.loads(sys.stdin.read()); print(d.get("acked_per_s"), d.get("cpu", {}).get("broker_cores"), d.get("error", ""))')"
}

single() {  # TURN
  PORT=$((PORT + 10)); local d; d=$(mktemp -d "$WORK/single.XXXXXX")
  BROKER_CPU=${MCPUS[0]} start_kit_broker "$d" "$PORT" -m broker_edge.runtime.main
  local bp=$BROKER_PID; STARTED+=("$bp")
  load "turn $1 single" "$PORT" "$bp"
  kill -TERM "$bp"; wait "$bp"; rm -rf "$d"
}

members() {  # TURN FACTOR
  local turn=$1 rf=$2 k n d ports=() pids=() cert key ca
  local isr=$(( rf < 2 ? rf : 2 ))
  for k in $(seq 0 $((MEMBERS - 1))); do
    n=b$((k + 1)); PORT=$((PORT + 10)); d=$(mktemp -d "$WORK/$n.XXXXXX")
    read -r _ cert key ca <<<"$(grep "^$n " "$WORK/certs.txt")"
    BROKER_CPU=${MCPUS[$k]} BROKER_YAML="cluster:
  node_id: $n
  etcd: [\"http://127.0.0.1:$EC\"]
  key_prefix: /turn$turn-rf$rf
  listen: {host: 127.0.0.1, port: $((PORT + 3))}
  advertise: {mqtt: \"127.0.0.1:$PORT\", offsets_api: \"http://127.0.0.1:$((PORT + 1))\"}
  tls: {certfile: $cert, keyfile: $key, cafile: $ca}
  replication_factor: $rf
  min_insync_replicas: $isr" start_kit_broker "$d" "$PORT" -m broker_edge.runtime.main
    pids+=("$BROKER_PID"); STARTED+=("$BROKER_PID"); ports+=("$PORT")
  done
  local apis; apis=$(for p in "${ports[@]}"; do printf '%s,' $((p + 1)); done); apis=${apis%,}
  echo "  rf$rf settled: $(timeout 35 "$PY" "$K/kitutil.py" clusterwait "$apis" "$MEMBERS" "$isr" 30)"
  load "turn $turn members rf$rf" "$(IFS=,; echo "${ports[*]}")" "$(IFS=,; echo "${pids[*]}")"
  kill -TERM "${pids[@]}"; wait "${pids[@]}"
}

for turn in $(seq 1 "$TURNS"); do
  if [ $((turn % 2)) = 1 ]; then
    single "$turn"; for rf in $RFS; do members "$turn" "$rf"; done
  else
    for rf in $RFS; do members "$turn" "$rf"; done; single "$turn"
  fi
done

"$PY" - "$R" "$MEMBERS" "$LAYOUT" <<'EOF' | tee "$OUT/summary.txt"
import json, re, statistics, sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
members = int(sys.argv[2])
targets = {"1": 0.8, "3": 0.3}
by_turn: dict[str, dict[str, dict]] = {}
for row in rows:
    turn, what = re.match(r"turn (\d+) (.*)", row["label"]).groups()
    by_turn.setdefault(turn, {})[what] = row


def void(row: dict) -> str:
    """Why a run does not count: an error, a lost connection or a load process at 90 % of a core."""
    cpu = row.get("cpu") or {}
    if not row.get("ok"):
        return "error"
    if row.get("lost_conns") or row.get("connect_errors"):
        return "lost connections"
    if (cpu.get("harness_cores_max_proc") or 0) >= 0.9:
        return "load generator saturated"
    return ""


per_member: dict[str, list[float]] = {}
print(f"{members} members against one broker, in turns (acknowledged/s; each turn's ratio to its own baseline)")
if sys.argv[3] != "dedicated":
    print(f"layout {sys.argv[3]}: the brokers share a cpu, so these ratios check the add-on, they measure nothing")
for turn, runs in sorted(by_turn.items(), key=lambda item: int(item[0])):
    alone = runs.get("single")
    if alone is None or void(alone) or not alone.get("acked_per_s"):
        print(f"turn {turn}: no valid one-broker run ({void(alone) if alone else 'missing'})")
        continue
    parts = [f"turn {turn}: one broker {alone['acked_per_s']:,}"]
    for what, row in sorted(runs.items()):
        if what == "single":
            continue
        rf = what.removeprefix("members rf")
        why = void(row)
        if why:
            parts.append(f"rf{rf} void ({why})")
            continue
        ratio = row["acked_per_s"] / alone["acked_per_s"]
        per_member.setdefault(rf, []).append(ratio / members)
        parts.append(f"rf{rf} {row['acked_per_s']:,} ({ratio:.2f}x, {ratio / members:.2f} per member)")
    print("; ".join(parts))
for rf, values in sorted(per_member.items()):
    median = statistics.median(values)
    target = targets.get(rf)
    verdict = "" if target is None else f", target {target}: {'met' if median >= target else 'not met'}"
    print(f"factor {rf}: median {median:.2f} per member over {len(values)} turns "
          f"(range {min(values):.2f}-{max(values):.2f}){verdict}")
EOF
