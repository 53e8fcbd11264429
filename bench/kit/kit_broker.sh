# Sourced by the kit add-ons (cpu_profile.sh, one_broker_turns.sh, members_turns.sh): the kit's Python, a
# broker started as the kit starts its own (the limits Mosquitto lacks lifted, logging at WARNING, pinned to
# one cpu), and the kit's etcd.
# Needs K (the kit's folder) and OUT.

# kit_python: PY and PYTHONPATH for the kit's wheels and sources (KIT_LOCAL=1: the checkout's .venv).
kit_python() {
  if [ -n "${KIT_LOCAL:-}" ]; then
    PY="$(cat "$K/src/CHECKOUT")/.venv/bin/python"; export PYTHONPATH=$K/src:$K
  else
    PY=python3
    if ! cmp -s /tmp/site/.kit-wheels <(ls "$K"/wheels); then  # (run.sh installs them there the same way)
      timeout 150 "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$K"/wheels/*.whl \
        >"$OUT/pip.log" 2>&1 || { echo "pip failed: $(tail -1 "$OUT/pip.log")"; exit 3; }
      ls "$K"/wheels >/tmp/site/.kit-wheels
    fi
    export PYTHONPATH=/tmp/site:$K/src:$K
  fi
  ulimit -n 65536 2>/dev/null || ulimit -n 20000
}

# start_kit_broker DIR PORT PYTHON-ARGS...: DIR/b.yaml for a broker on PORT (PORT+1, PORT+2 its HTTP
# endpoints), started in DIR with "$PY PYTHON-ARGS... --config DIR/b.yaml" on cpu BROKER_CPU (default 1),
# BROKER_YAML (default none) appended to its configuration; BROKER_PID once it listens (10 s at most).
start_kit_broker() {
  local dir=$1 port=$2 i; shift 2
  printf 'listeners:\n  - {name: default, type: tcp, host: 127.0.0.1, port: %s}\nstorage:\n  directory: %s/data\noffsets_api: {port: %s}\nadmin_http: {port: %s}\nlimits:\n  max_connections: 100000\n  new_connections_per_second: 0\n  messages_per_second_per_client: 0\n  max_topics_per_client: 0\n  max_topics_per_identity: 0\n  max_offline_messages: 1000000\n  max_offline_bytes: 1073741824\n  outgoing_buffer_bytes: 268435456\nlogging:\n  level: WARNING\n%s\n' \
    "$port" "$dir" $((port + 1)) $((port + 2)) "${BROKER_YAML:-}" >"$dir/b.yaml"
  (cd "$dir" && exec taskset -c "${BROKER_CPU:-1}" "$PY" "$@" --config "$dir/b.yaml") >"$dir/broker.log" 2>&1 &
  BROKER_PID=$!
  for i in $(seq 1 100); do (echo >/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break; sleep 0.1; done
}

# start_kit_etcd DIR CLIENT-PORT PEER-PORT: the kit's etcd (native/bin/etcd.gz, through the kit's glibc where
# the system's is too old) on cpu ETCD_CPU (default 0), its data in DIR; ETCD_PID once it listens (20 s at
# most), or a message and status 1.
start_kit_etcd() {
  local dir=$1 client=$2 peer=$3 i etcd; mkdir -p "$dir/data" && chmod 700 "$dir/data"
  gzip -dc "$K/native/bin/etcd.gz" >"$dir/etcd" && chmod +x "$dir/etcd"
  etcd=("$dir/etcd")
  "${etcd[@]}" --version >/dev/null 2>&1 || etcd=("$K/native/glibc/ld-linux-x86-64.so.2" --library-path "$K/native/glibc" "$dir/etcd")
  taskset -c "${ETCD_CPU:-0}" "${etcd[@]}" --name e1 --data-dir "$dir/data" --log-level warn --logger zap \
    --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "e1=http://127.0.0.1:$peer" --initial-cluster-state new >"$dir/etcd.log" 2>&1 &
  ETCD_PID=$!
  "$PY" "$K/kitutil.py" waitport "$client" "$ETCD_PID" 20 || { echo "etcd did not start: $(tail -3 "$dir/etcd.log")"; return 1; }
}
