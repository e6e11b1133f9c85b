# Topicbase: the two commands are `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv test lint demo demo-sql demo-storage bench bench-quick chaos clean java spark-jar pgjdbc

# The editable install, and the checkout on the venv's path as a plain entry beside
# setuptools' editable finder: Spark finds data sources by scanning sys.path for pyspark_*
# modules (pyspark.sql.worker.lookup_data_sources: pkgutil.iter_modules), which the finder
# does not show, so format("topicbase") works without spark_sql_ext.register(spark).
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,console]'
	echo '$(CURDIR)' > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/topicbase_checkout.pth"
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# Spark (the test extra pins pyspark) needs Java 17: installed through apt when java or
# javac is missing (openjdk-17-jdk-headless and its JRE: ~115 MB download, ~265 MB on
# disk, up to ~330 MB with the libraries and fonts it pulls into a bare image).
# `make java APT_GET=echo` is a dry run (tests/spark/test_make_java.py runs it).
APT_GET ?= apt-get
java:
	@command -v java >/dev/null 2>&1 && command -v javac >/dev/null 2>&1 || \
	  { $(APT_GET) update -q && $(APT_GET) install -y -q --no-install-recommends openjdk-17-jdk-headless; }

# The PostgreSQL JDBC driver (Debian's libpostgresql-jdbc-java, ~1 MB): the wire tests run
# it as Spark's JDBC writer does.
pgjdbc: java
	@test -f /usr/share/java/postgresql.jar || \
	  { apt-get update -q && apt-get install -y -q --no-install-recommends libpostgresql-jdbc-java; }

# The Spark SQL catalog's jar (spark_sql_ext/java -> spark_sql_ext/jars), ~5 s.
spark-jar: $(STAMP) java
	$(PY) -m spark_sql_ext.build_jar

# pytest exits 5 when no test ran: treat that as failure like any other non-zero code.
# The suite runs on TEST_WORKERS pytest-xdist workers (default 2, the CI's cores); every
# Spark test goes to one worker, with the run's one SparkSession (tests/conftest.py).
# Then the ledger-on lane (``pytest --ledger``: the store's ledger switched on, statements
# over 4 partitions or more written to it; tests/conftest.py, docs/scale.md round 31) over
# the tests of the paths it changes: topics, spread statements and their crashes, reads of
# many partitions, retention, offsets, a short chaos run. ~65-75 s of wall on 2 cores.
LEDGER_LANE_TESTS := tests/storage/test_topic_log.py tests/storage/test_spread_publish.py \
	tests/storage/test_store.py tests/storage/test_check_ledger.py \
	tests/engine/test_spread_append.py tests/engine/test_spread_append_races.py \
	tests/engine/test_spread_append_crash.py tests/engine/test_read_many_partitions.py \
	tests/engine/test_reads_many_frames.py tests/engine/test_ledger_append.py \
	tests/engine/test_ledger_read_across.py tests/engine/test_retention.py \
	tests/engine/test_offset_reset.py \
	tests/sim/test_chaos.py::test_short_chaos_run_finds_no_violation
TEST_WORKERS ?= 2
test: lint spark-jar pgjdbc
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup --ledger \
	  $(LEDGER_LANE_TESTS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests (ledger lane): failing"; exit 1; fi; \
	exit $$rc

# The main job: the pipeline on Spark (topicbase serve + Spark streaming queries), the
# resharding query killed midway and restarted from its checkpoint, then verified.
demo: $(STAMP) java
	$(PY) -m bench.demo_spark --data-dir ./demo-data/spark

# The same scenario in SQL transactions, with no Spark: workers killed midway, verified.
demo-sql: $(STAMP)
	$(PY) -m bench.demo_pipeline --data-dir ./demo-data/sql

# The storage walk-through: two producers, a resend skipped as duplicates.
demo-storage: $(STAMP)
	$(PY) -m bench.demo_storage --data-dir ./demo-data/storage-walkthrough

# Crash-consistency runs: workload -> kill, failpoint or power cut (unsynced data dropped)
# -> recover -> check history.
# CHAOS_CYCLES=N make chaos sets the number of cycles (default 50).
chaos: $(STAMP)
	$(PY) -m tests.sim.chaos --cycles $${CHAOS_CYCLES:-50}

# Benchmarks: Topicbase and its baselines (PostgreSQL 15, Redis: started and stopped on
# loopback by the harness) alternate, repetition by repetition; bench/results.json and
# bench/RESULTS.md (with PNG charts in bench/charts). ONLY=transactions,pgwire runs some.
bench: $(STAMP) spark-jar
	$(PY) -m bench.run --suite full $(if $(ONLY),--only $(ONLY))

bench-quick: $(STAMP) spark-jar
	$(PY) -m bench.run --suite quick $(if $(ONLY),--only $(ONLY))

clean:
	rm -rf $(VENV) demo-data build *.egg-info
