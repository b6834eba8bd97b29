# Quick start: `make run` (the main job) and `make test` (all tests). Both build .venv themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast venv bench lint fuzz clean zookeeper chromium console-shots bench-servers

$(STAMP): pyproject.toml setup.py common/format/_record_writer.c common/format/_codec.c common/format/_put_path.c common/format/_record_core.h common/format/_codec_internal.h common/ha/_ha_codec.c common/core/_native_helpers.h common/store/_reput_scan.c common/proxy/_received.c
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@# The C extensions (record writer, codecs, reput's scan) need gcc and the Python and zlib
	@# headers: as root they are installed when missing; without them the install skips the
	@# extensions (their Python versions run).
	@if ! { command -v gcc >/dev/null && [ -f "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ] \
	        && [ -f /usr/include/zlib.h ]; }; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing gcc and the Python and zlib headers (Debian's packages) for the C extensions"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends gcc python3-dev zlib1g-dev >/dev/null \
	    || echo "could not install them: the Python versions will run"; \
	  else \
	    echo "no gcc or Python/zlib headers: the Python versions will run"; \
	  fi; \
	fi
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,spark,drills,grpc]' --config-settings editable_mode=compat
	sync  # the install leaves ~900 MB dirty: write it now, not during the first timed tests
	touch $(STAMP)

venv: $(STAMP)

# The local group runs in controller mode on a ZooKeeper child process (Debian's package). As
# root it is installed when missing; otherwise this says what to install and the demo runs the
# group without the controller (`replog cluster up --no-controller`).
ZK_JAR := /usr/share/java/zookeeper.jar
zookeeper:
	@if [ ! -f $(ZK_JAR) ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing ZooKeeper (Debian's package) for the controller"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends zookeeper >/dev/null \
	    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends zookeeper >/dev/null; }; \
	  else \
	    echo "ZooKeeper is not installed: as root, run 'apt-get install -y zookeeper' to get the controller;"; \
	    echo "running the group without it (replog cluster up --no-controller)"; \
	  fi; \
	fi

# The console's browser tests drive Debian's chromium headless, through its chromedriver
# (Selenium is told both paths: nothing is downloaded). As root they are installed when missing.
chromium:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing chromium and chromium-driver (Debian's packages) for the console's browser tests"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null \
	    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null; }; \
	  else \
	    echo "chromium is not installed: as root, run 'apt-get install -y chromium chromium-driver' for the browser tests"; \
	  fi; \
	fi

run: $(STAMP) zookeeper
	$(BIN)/python -m common.cli.demo

# Screenshots of every page of the web console, into docs/console/ (the README links them).
console-shots: $(STAMP) zookeeper chromium
	$(BIN)/python tools/console_shots.py

# Every test but the perf tier (rates and latencies judged against targets: `make bench`).
# Died of a signal (status >= 128): name the test and the thread that crashed (tests/conftest.py).
test: $(STAMP) zookeeper chromium
	$(BIN)/python -m pytest -q -m "not perf" tests || { rc=$$?; [ $$rc -lt 128 ] || $(BIN)/python tests/fatal_report.py $$rc; exit $$rc; }

# The inner loop: unit and property tests (in-process brokers; no broker processes, no JVM).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not perf" tests/unit tests/property

# The servers the benchmarks compare replog with: Debian's redis-server and nats-server
# (bench/broker_put.py, bench/concurrency.py ...); as root they are installed when missing.
bench-servers:
	@if ! command -v redis-server >/dev/null || [ ! -x /usr/sbin/nats-server ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing redis-server and nats-server (Debian's packages) for the benchmarks' references"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server nats-server >/dev/null \
	    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server nats-server >/dev/null; }; \
	  else \
	    echo "redis-server or nats-server is not installed: as root, run 'apt-get install -y redis-server nats-server'; their rows are skipped"; \
	  fi; \
	fi

# The benchmark scripts, then the perf tier; every part runs, the status says if any failed.
bench: $(STAMP) bench-servers
	rc=0; for f in bench/[!_]*.py; do $(BIN)/python $$f || rc=1; done; \
	$(BIN)/python -m pytest -q -m perf -rA tests || rc=1; exit $$rc

# Coverage-guided fuzzing of the parsers (fuzz/, atheris): each target for FUZZ_SECONDS, one
# after another; a crash stops with its input kept in fuzz/corpus/<target>/crash-* (replayed
# by tests/property/test_fuzz_regressions.py from then on). FUZZ_TOLERATE=name,... steps over
# open findings (fuzz/_harness.py) so a long run explores past them.
FUZZ_SECONDS ?= 600
FUZZ_TARGETS ?= request_decoders zmtp_stream record_parse reput_scan ha_codec sql92_compile grpc_convert
fuzz: $(STAMP)
	set -e; for t in $(FUZZ_TARGETS); do \
	  echo "== $$t ($(FUZZ_SECONDS) s)"; \
	  $(BIN)/python fuzz/$$t.py -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1; \
	done

lint: $(STAMP)
	$(BIN)/ruff check common master slave tests bench tools fuzz
	$(BIN)/mypy common master slave tests/helpers

clean:
	rm -rf $(VENV) build *.egg-info
