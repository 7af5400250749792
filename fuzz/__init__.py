"""The standing fuzz campaign (``make fuzz``, not part of ``make test``): coverage-guided
fuzzing of every reader (fuzz/targets.py, run by fuzz/run.py with atheris) and fuzzed calls of
both gRPC APIs against real servers (fuzz/calls.py)."""
