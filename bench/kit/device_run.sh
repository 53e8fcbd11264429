#!/bin/bash
# The many-core measurements as one command, for a machine lent for a few minutes: the kit's shapes
# (run.sh: fanout, fan-in, fleet, the cluster with 3 members; KIT_BUDGET_S, default 300 s), then 6 members in
# turns with one broker (members_turns.sh, about 3 minutes), then, with PROFILE=1, where one broker's CPU
# goes (cpu_profile.sh, about a minute). Each step's summary and raw results land in OUT as a few files
# (kit-summary.txt, kit-results.jsonl, kit-env.txt, members-summary.txt, members.jsonl, profile.tar.gz,
# steps.log), what a lent machine's output folder brings back.
#   bash ../shared/bigbench/build.sh && cp bench/cpu_samples.py bench/kit/*.sh .bigbench/
#   cd .bigbench && OUT=/tmp/many-core bash device_run.sh
# The whole run ends within DEVICE_BUDGET_S (default 570 s, under the 600 s a lent machine gives one
# command): the members get the turns that fit in what the kit left (about 60 s each, 3 at most, none under
# one), the profile runs only with 100 s left (with the kit's defaults it rarely is: PROFILE=1 wants
# KIT_BUDGET_S=200 or so), and a step cut at the deadline still leaves its raw results.
# KIT_LOCAL=1 runs every step tiny here (a check that it works, not a measure).
set -u
K=$(cd "$(dirname "$0")" && pwd); OUT=${OUT:-/tmp/many-core}; mkdir -p "$OUT"
T0=$(date +%s); DEADLINE=$(( T0 + ${DEVICE_BUDGET_S:-570} ))
say() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/steps.log"; }
left() { echo $(( DEADLINE - $(date +%s) )); }
W=$(mktemp -d /tmp/device-run.XXXXXX)
say "kit: $(cat "$K/src/COMMIT" 2>/dev/null | cut -c1-12), $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
KIT_S=$(( ${KIT_BUDGET_S:-300} + 90 )); [ "$KIT_S" -gt "$(( $(left) - 10 ))" ] && KIT_S=$(( $(left) - 10 ))
KIT_BUDGET_S=${KIT_BUDGET_S:-300} OUT=$W/kit timeout "$KIT_S" bash "$K/run.sh" >"$W/kit.out" 2>&1
say "kit done (rc $?)"
cp "$W/kit/summary.txt" "$OUT/kit-summary.txt" 2>/dev/null; cp "$W/kit/results.jsonl" "$OUT/kit-results.jsonl" 2>/dev/null
cp "$W/kit/env.txt" "$OUT/kit-env.txt" 2>/dev/null
TURNS=$(( ( $(left) - 30 ) / 60 )); [ "$TURNS" -gt 3 ] && TURNS=3
if [ "$TURNS" -ge 1 ]; then
  TURNS=$TURNS OUT=$W/members timeout $(( $(left) - 10 )) bash "$K/members_turns.sh" >"$W/members.out" 2>&1
  say "members in turns done (TURNS=$TURNS, rc $?)"
else
  say "members in turns left out: $(left) s left"
fi
cp "$W/members/summary.txt" "$OUT/members-summary.txt" 2>/dev/null
cp "$W/members/members.jsonl" "$OUT/members.jsonl" 2>/dev/null
if [ -n "${PROFILE:-}" ] && [ "$(left)" -ge 100 ]; then
  OUT=$W/profile timeout $(( $(left) - 10 )) bash "$K/cpu_profile.sh" >"$W/profile.out" 2>&1
  say "profile done (rc $?)"
elif [ -n "${PROFILE:-}" ]; then
  say "profile left out: $(left) s left"
fi
tail -n 40 "$W"/*.out >>"$OUT/steps.log" 2>/dev/null
[ -d "$W/profile" ] && tar -czf "$OUT/profile.tar.gz" -C "$W" profile
rm -rf "$W"
cat "$OUT/kit-summary.txt" "$OUT/members-summary.txt" 2>/dev/null
