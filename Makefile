# Timestone: two commands on a fresh machine.
#   make demo   set up .venv and run the end-to-end demo (local broker, simulated devices, local Spark, Delta)
#   make test   set up .venv and the test tools, then lint and run the whole test suite
# Everything else here is what those two need.

PYTHON ?= python3
VENV   := .venv
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench setup system-deps clean

demo: $(STAMP)
	$(VENV)/bin/timestone demo

test: $(STAMP) system-deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest

# Every benchmark writes its section into bench/results/ (commitlog, Spark source, telemetry job, OTA, footprint,
# cluster, cluster fanout, cluster under faults, many topics, a fleet against Mosquitto and Aedes, ingest per
# core and a QoS 0 flood against Mosquitto, the engine's CPU per message, members on one host, uplink, TLS
# accept), and the uplink's WAN cut of five minutes (the suite's test with a longer cut: a check, not a figure),
# then the broker suite writes bench/RESULTS.md with every bench/results/*.md section appended: one command
# regenerates every published figure (about 50 minutes on a 2-core machine; run it on a quiet one).
bench: $(STAMP) system-deps
	$(VENV)/bin/python bench/commitlog_bench.py --write
	$(VENV)/bin/python bench/source_bench.py --write
	$(VENV)/bin/python bench/telemetry_bench.py
	$(VENV)/bin/python bench/ota_bench.py
	$(VENV)/bin/python bench/rollout_bench.py
	$(VENV)/bin/python -m bench.footprint_bench --write
	$(VENV)/bin/python -m bench.cluster_bench
	$(VENV)/bin/python -m bench.cluster_fanout_bench
	$(VENV)/bin/python -m bench.cluster_faults_bench
	$(VENV)/bin/python -m bench.sessions_bench
	$(VENV)/bin/python -m bench.topics_bench
	$(VENV)/bin/python -m bench.fleet_bench
	$(VENV)/bin/python -m bench.ingest_bench --variants
	$(VENV)/bin/python -m bench.flood_bench
	$(VENV)/bin/python -m bench.ingest_floor
	$(VENV)/bin/python -m bench.workers_bench
	$(VENV)/bin/python -m bench.uplink_bench
	TIMESTONE_WAN_CUT_S=300 $(VENV)/bin/pytest -q -p no:cacheprovider tests/e2e/uplink/test_uplink_wan.py
	$(VENV)/bin/python -m bench.tls_accept_bench
	$(VENV)/bin/python -m bench

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

setup: $(STAMP) system-deps

# The virtual environment, rebuilt when the declared dependencies change.
$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet -e '.[pipelines,spark,dev,cluster,notebooks]'
	touch $(STAMP)

# Debian packages and npm packages the tests and benchmarks drive (Mosquitto's clients, etcd, MQTT.js).
system-deps:
	bash .ci/system-deps

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
