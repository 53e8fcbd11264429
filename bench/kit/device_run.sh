#!/bin/bash
# The many-core measurements as one command, for a machine lent for a few minutes: the kit's shapes
# (run.sh: fanout, fan-in, fleet, the cluster with 3 members; KIT_BUDGET_S, default 300 s), then 6 members in
# turns with one broker (members_turns.sh, about 3 minutes), then, with PROFILE=1, where one broker's CPU
# goes (cpu_profile.sh, about a minute). Each step's summary and raw results land in OUT as a few files
# (kit-summary.txt, kit-results.jsonl, kit-env.txt, members-summary.txt, members.jsonl, profile.tar.gz,
# steps.log), what a lent machine's output folder brings back.
#   bash ../shared/bigbench/build.sh && cp bench/cpu_samples.py bench/kit/*.sh .bigbench/
#   cd .bigbench && OUT=/tmp/many-core bash device_run.sh
# KIT_LOCAL=1 runs every step tiny here (a check that it works, not a measure).
set -u
K=$(cd "$(dirname "$0")" && pwd); OUT=${OUT:-/tmp/many-core}; mkdir -p "$OUT"
T0=$(date +%s)
say() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/steps.log"; }
W=$(mktemp -d /tmp/device-run.XXXXXX)
say "kit: $(cat "$K/src/COMMIT" 2>/dev/null | cut -c1-12), $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
KIT_BUDGET_S=${KIT_BUDGET_S:-300} OUT=$W/kit timeout $(( ${KIT_BUDGET_S:-300} + 90 )) bash "$K/run.sh" >"$W/kit.out" 2>&1
say "kit done (rc $?)"
cp "$W/kit/summary.txt" "$OUT/kit-summary.txt" 2>/dev/null; cp "$W/kit/results.jsonl" "$OUT/kit-results.jsonl" 2>/dev/null
cp "$W/kit/env.txt" "$OUT/kit-env.txt" 2>/dev/null
OUT=$W/members timeout 400 bash "$K/members_turns.sh" >"$W/members.out" 2>&1
say "members in turns done (rc $?)"
cp "$W/members/summary.txt" "$OUT/members-summary.txt" 2>/dev/null
cp "$W/members/members.jsonl" "$OUT/members.jsonl" 2>/dev/null
if [ -n "${PROFILE:-}" ]; then
  OUT=$W/profile timeout 200 bash "$K/cpu_profile.sh" >"$W/profile.out" 2>&1
  say "profile done (rc $?)"
fi
tail -n 40 "$W"/*.out >>"$OUT/steps.log" 2>/dev/null
[ -d "$W/profile" ] && tar -czf "$OUT/profile.tar.gz" -C "$W" profile
rm -rf "$W"
cat "$OUT/kit-summary.txt" "$OUT/members-summary.txt" 2>/dev/null
