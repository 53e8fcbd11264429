# Timestone: two commands on a fresh machine.
#   make demo   set up .venv and run the end-to-end demo (local broker, simulated devices, local Spark, Delta)
#   make test   set up .venv and the test tools, then lint and run the whole test suite (the Spark end-to-end
#               tests again on Spark 4.0, in .venv-spark40)
# Everything else here is what those two need.

PYTHON ?= python3
VENV   := .venv
STAMP  := $(VENV)/.installed
# The extras each venv gets, at the versions pinned in its constraints file (`make lock` writes them again).
EXTRAS      := pipelines,spark,dev,cluster,notebooks
CONSTRAINTS := .ci/constraints.txt
# The oldest Spark the sources and jobs support (Databricks Runtime 17.3 LTS ships 4.0.0), in a venv of its own.
VENV40  := .venv-spark40
STAMP40 := $(VENV40)/.installed
EXTRAS40      := pipelines,spark40,dev,cluster
CONSTRAINTS40 := .ci/constraints-spark40.txt
# What runs on it again: the sources' and the telemetry and actions jobs' end-to-end tests (docs/spark-source.md),
# on the same workers (2:55 against 4:21 on one, 189 tests, 2026-12-03).
# The suite's workers (pytest-xdist): one per core. On a 2-core machine three were no faster than two (30:29,
# against 28:53 and 31:56 for two the same day, 2026-11-27), the CPU busy 98 % of the run, and two tests failed
# under the load. Tried again on 2026-12-07 (brokers forked, fewer clusters started; two workers left 15 % of
# the CPU idle over a whole run, vmstat every 10 s): three left 4 % idle, and two of their first 700 tests
# (30:30) failed under the load; the run was stopped there. tests/conftest.py keeps each module on one
# worker, and the tests of the demo run and of the S3 endpoint together (tests/unit/test_test_groups.py).
TEST_WORKERS ?= 2
# The project's modules compiled once before the suite (compileall writes __pycache__ even where
# PYTHONDONTWRITEBYTECODE is set, as on many CI images): each broker, member and command the tests start as a
# process of its own loads them instead of compiling its modules' sources again, a fifth of the CPU time of the
# cluster tests (tests/e2e/cluster/test_membership.py and test_workers_guards.py: 35.5 s against 44.6 s,
# 2026-12-03). A module changed later is compiled again from its source, as Python checks each file's stamp.
PACKAGES := broker_edge sources sinks pipelines
SPARK40_TESTS := tests/unit/sources tests/e2e/sources/test_stream_reader.py \
	tests/e2e/sources/test_timestone_source_spark.py tests/e2e/sources/test_delta_cdf.py \
	tests/e2e/sinks/test_spark_arrow.py tests/e2e/sinks/test_delta_rs_store.py \
	tests/e2e/telemetry/test_telemetry_stream.py tests/e2e/ota/test_actions_job.py

.PHONY: demo test test-durations lint lock bench setup system-deps clean

demo: $(STAMP)
	$(VENV)/bin/timestone demo

test: $(STAMP) $(STAMP40) system-deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/python -m compileall -q -j 0 -x '/\.venv' $(PACKAGES) bench tests > /dev/null
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25
	$(VENV40)/bin/pytest -n $(TEST_WORKERS) --dist loadgroup -p no:cacheprovider $(SPARK40_TESTS)

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
	$(VENV)/bin/python -m bench.ingest_bench --variants --floor
	$(VENV)/bin/python -m bench.flood_bench
	$(VENV)/bin/python -m bench.ingest_floor
	$(VENV)/bin/python -m bench.workers_bench
	$(VENV)/bin/python -m bench.storm_bench
	$(VENV)/bin/python -m bench.uplink_bench
	TIMESTONE_WAN_CUT_S=300 $(VENV)/bin/pytest -q -p no:cacheprovider tests/e2e/uplink/test_uplink_wan.py
	$(VENV)/bin/python -m bench.tls_accept_bench
	$(VENV)/bin/python -m bench

# The seconds each test module took (tests/durations.json), from which tests/conftest.py hands out the costliest
# groups of tests first (tests/durations.py): refresh it after adding or lengthening a long test.
test-durations: $(STAMP) system-deps
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadgroup --record-durations tests/durations.json

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

setup: $(STAMP) system-deps

# The virtual environments, rebuilt when the declared dependencies or their pins change. Every package is
# installed at the version its constraints file pins, the set the suite passed with: a release of a
# dependency (a linter's new rules or style, a library's changed behaviour) changes nothing here until
# `make lock` takes it in.
$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet -c $(CONSTRAINTS) -e '.[$(EXTRAS)]'
	touch $(STAMP)

$(STAMP40): pyproject.toml $(CONSTRAINTS40)
	test -x $(VENV40)/bin/python || $(PYTHON) -m venv $(VENV40)
	$(VENV40)/bin/pip install --quiet -c $(CONSTRAINTS40) -e '.[$(EXTRAS40)]'
	touch $(STAMP40)

# Pin again what pyproject.toml's ranges resolve to today, in fresh venvs (then run `make test`).
lock:
	bash .ci/lock $(CONSTRAINTS) $(EXTRAS)
	bash .ci/lock $(CONSTRAINTS40) $(EXTRAS40)

# Debian packages and npm packages the tests and benchmarks drive (Mosquitto's clients, etcd, MQTT.js).
system-deps:
	bash .ci/system-deps

clean:
	rm -rf $(VENV) $(VENV40) build *.egg-info .pytest_cache .ruff_cache
