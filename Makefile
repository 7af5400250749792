# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The engine-side modules, compiled in place with mypyc (see eva/native.py).
NATIVE := $(addprefix eva/,events.py semantics.py classes.py state.py nodes.py compiler.py engine.py \
	notify.py admission.py)
NATIVE_STAMP := build/.native

.PHONY: demo test test-pure fuzz fidelity install native pure proto wheel lint typecheck bench \
	clean servers

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

$(NATIVE_STAMP): $(STAMP) $(NATIVE)
	$(BIN)/python tools/build_native.py > build.log 2>&1 || (cat build.log; exit 1)
	touch eva/*.so  # the in-place copy keeps the build's older mtimes
	mkdir -p build && touch $(NATIVE_STAMP)

native: $(NATIVE_STAMP)

# .venv with the package (editable) and its engine compiled: what the README's tour needs.
install: native

pure:
	rm -f eva/*.so $(NATIVE_STAMP)

# The gRPC stubs in adapters/_proto, regenerated after a change to proto/ (kept in git; a test
# fails while they differ from what this generates).
proto: $(STAMP)
	$(BIN)/python tools/gen_proto.py

# An installable wheel in dist/, the engine core compiled for this platform (setup.py;
# EVAMED_PURE=1 for a pure-Python one).
wheel: $(STAMP)
	$(BIN)/pip wheel --quiet --no-deps --no-build-isolation --wheel-dir dist .

demo: native servers
	mkdir -p build
	$(BIN)/evamed check examples/logistics/profiles.eva
	$(BIN)/python examples/logistics/generate.py --out examples/logistics/day.jsonl
	$(BIN)/evamed replay --profiles examples/logistics/profiles.eva \
		--events examples/logistics/day.jsonl --summary > build/demo-plain.jsonl
	$(BIN)/evamed replay --profiles examples/logistics/profiles.eva \
		--events examples/logistics/day.jsonl --via cg3 > build/demo-via-cg3.jsonl
	cmp build/demo-plain.jsonl build/demo-via-cg3.jsonl && \
		echo "replay --via cg3 (plan, SQL, native evaluation, post-filter): the same $$(wc -l < build/demo-plain.jsonl) composites"
	$(BIN)/evamed demo

# The Debian servers the integration tests start for real (redis-server; mosquitto, whose
# daemon is in /usr/sbin, mosquitto-clients for mosquitto_sub, openssl for its test TLS CA).
servers:
	@{ command -v redis-server && { command -v mosquitto || [ -x /usr/sbin/mosquitto ]; } && \
		command -v mosquitto_sub && command -v openssl; } >/dev/null 2>&1 || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq redis-server mosquitto \
			mosquitto-clients openssl >/dev/null; }

test: native servers
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -n 2 --dist loadgroup
	$(MAKE) --no-print-directory test-pure

# The same source interpreted (no extensions): the central equivalence property and the
# paper's examples, so the pure-Python path cannot drift from the compiled one.
test-pure: $(STAMP)
	rm -rf build/pure && mkdir -p build/pure
	tar --exclude='*.so' --exclude='__pycache__' -cf - eva mediator tests examples pyproject.toml \
		| tar -xf - -C build/pure
	cd build/pure && PYTHONPATH=. ../../$(BIN)/pytest -n 2 -p no:cacheprovider \
		tests/test_paper_examples.py tests/test_engine_equivalence.py tests/test_snapshot.py \
		-k "paper or fig or tv or p1 or p2 or p5 or random_profiles_of_depth_3 or restored"

# The standing fuzz campaign, not part of `make test` (docs/operations.md, "Fuzzing"): every
# reader coverage-guided for FUZZ_SECONDS each (its corpus kept in build/fuzz/corpus, so the
# next run goes on from there), then FUZZ_CALLS fuzzed calls of each gRPC API against real
# servers. Exit 1 on any finding (build/fuzz/findings/, build/fuzz/calls.json).
FUZZ_SECONDS ?= 120
FUZZ_CALLS ?= 10000
fuzz: native
	$(BIN)/pip install --quiet -e ".[fuzz]"
	$(BIN)/python -m fuzz.run --seconds $(FUZZ_SECONDS)
	$(BIN)/python -m fuzz.calls --calls $(FUZZ_CALLS)

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

bench: native
	$(BIN)/python benchmarks/engine.py

# The fidelity search (issue 26; not in `make test`): every path against the reference
# evaluator on random profiles × every group × random traces, each disagreement shrunk and
# recorded as a test case (tests/fidelity_cases.json). One process; FIDELITY_ARGS to change
# the count or the time, e.g. FIDELITY_ARGS="--examples 20000 --minutes 10 --no-spark".
FIDELITY_ARGS ?= --examples 100000 --minutes 60
fidelity: native
	PYTHONPATH=. $(BIN)/python benchmarks/fidelity.py $(FIDELITY_ARGS) --record tests/fidelity_cases.json

clean: pure
	rm -rf $(VENV) build dist build.log .pytest_cache .mypy_cache .ruff_cache .hypothesis
