"""The fuzzing campaign's own bookkeeping (fuzz/run.py): a slow input found under the fuzzer
is re-run uninstrumented before it counts, and a stopped worker's progress is still counted.
(The campaign itself needs atheris, the `fuzz` extra: `make fuzz`.)"""

from __future__ import annotations

from pathlib import Path

from fuzz.run import _RUNS, _confirmed


def test_a_timeout_that_is_fast_uninstrumented_is_set_aside_not_counted(tmp_path: Path) -> None:
    found = tmp_path / "timeout-0123"
    found.write_bytes(b'class A = type == "a"\nprofile P = A\n')
    assert _confirmed("profile", found) is False
    assert not found.exists()
    assert (tmp_path / "unconfirmed" / "timeout-0123").read_bytes().startswith(b"class A")


def test_an_input_the_reader_fails_on_stays_a_finding(tmp_path: Path) -> None:
    """The re-run's own exit code counts: an input that raises (here: no such target file is
    readable) is confirmed, never set aside."""
    missing = tmp_path / "timeout-gone"
    assert _confirmed("profile", missing) is True


def test_a_stopped_worker_s_count_is_its_last_progress_line() -> None:
    log = (b"#2\tINITED cov: 1 ft: 1 corp: 1/1b exec/s: 0 rss: 1Mb\n"
           b"#48962\tNEW    cov: 437 ft: 1810 corp: 153/63Kb lim: 4082 exec/s: 582\n"
           b"KeyboardInterrupt: stopping.\n")
    assert _RUNS.findall(log)[-1:] == [b"48962"]
    assert int(_RUNS.findall(log)[-1]) == 48962
