# Sourced by the kit add-ons (cpu_profile.sh, one_broker_turns.sh): the kit's Python, and one broker
# started as the kit starts its own (the limits Mosquitto lacks lifted, logging at WARNING, pinned to cpu 1).
# Needs K (the kit's folder) and OUT.

# kit_python: PY and PYTHONPATH for the kit's wheels and sources (KIT_LOCAL=1: the checkout's .venv).
kit_python() {
  if [ -n "${KIT_LOCAL:-}" ]; then
    PY="$(cat "$K/src/CHECKOUT")/.venv/bin/python"; export PYTHONPATH=$K/src:$K
  else
    PY=python3
    timeout 150 "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$K"/wheels/*.whl \
      >"$OUT/pip.log" 2>&1 || { echo "pip failed: $(tail -1 "$OUT/pip.log")"; exit 3; }
    export PYTHONPATH=/tmp/site:$K/src:$K
  fi
  ulimit -n 65536 2>/dev/null || ulimit -n 20000
}

# start_kit_broker DIR PORT PYTHON-ARGS...: DIR/b.yaml for a broker on PORT (PORT+1, PORT+2 its HTTP
# endpoints), started in DIR with "$PY PYTHON-ARGS... --config DIR/b.yaml" on cpu 1; BROKER_PID once it
# listens (10 s at most).
start_kit_broker() {
  local dir=$1 port=$2 i; shift 2
  printf 'listeners:\n  - {name: default, type: tcp, host: 127.0.0.1, port: %s}\nstorage:\n  directory: %s/data\noffsets_api: {port: %s}\nadmin_http: {port: %s}\nlimits:\n  max_connections: 100000\n  new_connections_per_second: 0\n  messages_per_second_per_client: 0\n  max_topics_per_client: 0\n  max_topics_per_identity: 0\n  max_offline_messages: 1000000\n  max_offline_bytes: 1073741824\n  outgoing_buffer_bytes: 268435456\nlogging:\n  level: WARNING\n' \
    "$port" "$dir" $((port + 1)) $((port + 2)) >"$dir/b.yaml"
  (cd "$dir" && exec taskset -c 1 "$PY" "$@" --config "$dir/b.yaml") >"$dir/broker.log" 2>&1 &
  BROKER_PID=$!
  for i in $(seq 1 100); do (echo >/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break; sleep 0.1; done
}
