"""The installed package: the shipped gRPC stubs match proto/, `--version` says which engine
runs, and a wheel installed into a fresh virtual environment runs `check`, `replay` and a base
service from a directory outside the repository. Installed with its core dependencies only (no
extra), it serves, subscribes and publishes, fits its size budget, and a feature that needs an
extra names it; the wheel declares its licence (MIT) and extras."""

from __future__ import annotations

import email
import json
import os
import re
import runpy
import select
import shutil
import subprocess
import sys
import sysconfig
import time
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pool  # type: ignore[import-untyped]
from typer.testing import CliRunner

from adapters._proto import base_pb2_grpc
from adapters.wire import FILE_DESCRIPTOR, SERVICE_NAME
from eva import native
from mediator.cli import app

ROOT = Path(__file__).resolve().parents[1]
GEN = runpy.run_path(str(ROOT / "tools" / "gen_proto.py"))
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _floor(requirements: list[str], name: str) -> tuple[int, ...]:
    for line in requirements:
        found = re.fullmatch(rf"{name}\s*(?:>=|==)\s*([\d.]+)", line.strip())
        if found:
            return tuple(int(part) for part in found.group(1).split("."))
    raise AssertionError(f"no {name}>=… in {requirements}")


def test_the_shipped_stubs_are_what_the_proto_generates() -> None:
    """adapters/_proto is regenerated with the pinned grpcio-tools: the same bytes, or the test
    names the files to regenerate (`make proto`)."""
    assert GEN["differences"](GEN["generate"]()) == []


def test_the_dependency_floors_cover_the_generated_stubs() -> None:
    """The stubs refuse a grpcio older than the grpcio-tools that generated them, and protobuf
    older than its gencode: the package's floors must be at least those, and the dev pin of
    grpcio-tools is the generator of the committed files."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    grpc_generated = tuple(int(p) for p in base_pb2_grpc.GRPC_GENERATED_VERSION.split("."))
    pb2 = (ROOT / "adapters" / "_proto" / "base_pb2.py").read_text()
    found = re.search(r"# Protobuf Python Version: ([\d.]+)", pb2)
    assert found is not None
    protobuf_generated = tuple(int(p) for p in found.group(1).split("."))
    assert _floor(project["dependencies"], "grpcio") >= grpc_generated
    assert _floor(project["dependencies"], "protobuf") >= protobuf_generated
    assert _floor(project["optional-dependencies"]["dev"], "grpcio-tools") == grpc_generated


def test_the_stubs_register_the_proto_where_reflection_looks() -> None:
    """Server reflection answers from protobuf's default pool: the service's file is there,
    under its own name (not the package's module path)."""
    found = descriptor_pool.Default().FindFileContainingSymbol(SERVICE_NAME)
    assert found.name == "eva/base/v1/base.proto" == FILE_DESCRIPTOR.name
    assert [s.full_name for s in found.services_by_name.values()] == [SERVICE_NAME]


def test_version_names_the_engine_that_runs() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"evamed {VERSION} ({native.engine_kind()})\n"
    # What runs is what was imported: an extension, or the .py beside it.
    compiled = native.running()
    assert compiled == native.compiled()  # the extensions present are the ones imported
    assert native.engine_kind() == ("pure Python engine" if not compiled else "compiled engine"
                                    if len(compiled) == len(native.MODULES)
                                    else f"engine partly compiled: {', '.join(compiled)}")


def test_python_dash_m_mediator_is_the_cli(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "mediator", "--version"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"evamed {VERSION} ({native.engine_kind()})\n"


# ---------------------------------------------------------------------------------------------
# The wheel, built once per module (one xdist worker runs the group) and installed into a
# fresh virtual environment. Its dependencies come from the development environment through a
# .pth file, appended after the fresh site-packages, so the wheel's own files are found first
# and nothing is downloaded.

_IGNORED = shutil.ignore_patterns(".git", ".venv", "build", "dist", "out", "__pycache__", "*.so",
                                  "*.egg-info", ".pytest_cache", ".mypy_cache", ".ruff_cache",
                                  ".hypothesis", "build.log", "*.jsonl")


@dataclass
class Installed:
    wheel: Path
    venv: Path
    work: Path  # the working directory of every command: outside the repository
    env: dict[str, str]
    seconds: dict[str, float]

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), cwd=self.work, env=self.env, capture_output=True,
                              text=True, timeout=timeout)

    @property
    def bin(self) -> Path:
        return self.venv / "bin"


def _have_c_compiler() -> bool:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(compiler) is not None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, float]]]:
    """The wheel, built from a copy of the tree; and the timings of this module's steps."""
    base = tmp_path_factory.mktemp("wheel")
    seconds: dict[str, float] = {}
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=_IGNORED)
    start = time.monotonic()
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                            "--no-build-isolation", "--wheel-dir", str(base / "dist"), str(source)],
                           cwd=source, capture_output=True, text=True, timeout=1200)
    assert built.returncode == 0, built.stdout + built.stderr
    seconds["wheel build"] = time.monotonic() - start
    (found,) = (base / "dist").glob("evamed-*.whl")
    yield found, seconds
    print(f"\ntest_install timings: {', '.join(f'{k} {v:.0f} s' for k, v in seconds.items())}; "
          f"the wheel {found.stat().st_size / 1e6:.1f} MB")


def _install(base: Path, wheel: Path, dependencies: Path) -> Installed:
    """A fresh virtual environment with the wheel installed, its dependencies found in
    ``dependencies`` (a .pth file, after its own site-packages)."""
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = str(venv / "bin" / "python")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet",
                           "--no-deps", "--no-index", str(wheel)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "evamed_test_dependencies.pth").write_text(str(dependencies) + "\n")
    work = base / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    env["EVAMED_CREDENTIALS"] = str(base / "credentials.toml")
    return Installed(wheel, venv, work, env, {})


@pytest.fixture(scope="module")
def installed(wheel: tuple[Path, dict[str, float]],
              tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel with every dependency of the development environment (extras included)."""
    start = time.monotonic()
    done = _install(tmp_path_factory.mktemp("install"), wheel[0],
                    Path(sysconfig.get_path("purelib")))
    wheel[1]["venv and install"] = time.monotonic() - start
    return done


@pytest.mark.slow
@pytest.mark.xdist_group("install")
def test_the_wheel_ships_the_stubs_and_the_compiled_engine(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    assert {"adapters/_proto/base_pb2.py", "adapters/_proto/base_pb2_grpc.py",
            "mediator/__main__.py", "eva/grammar.lark"} <= set(names)
    assert not [n for n in names if n.startswith(("proto/", "google/", "tests/"))]
    extensions = {n.split("/")[-1].split(".")[0] for n in names
                  if n.startswith("eva/") and n.endswith(".so")}
    if _have_c_compiler():
        assert set(native.MODULES) <= extensions
        assert any(name.startswith("_engine__mypyc") for name in extensions)
    else:
        assert extensions == set()


@pytest.mark.slow
@pytest.mark.xdist_group("install")
def test_the_installed_package_is_the_one_that_runs(installed: Installed) -> None:
    want = "compiled engine" if _have_c_compiler() else "pure Python engine"
    for command in ([str(installed.bin / "evamed"), "--version"],
                    [str(installed.bin / "python"), "-m", "mediator", "--version"]):
        out = installed.run(*command)
        assert (out.returncode, out.stdout, out.stderr) == (0, f"evamed {VERSION} ({want})\n", "")
    script = ("import adapters.wire, mediator, eva.engine as e\n"
              "print(mediator.__file__); print(adapters.wire.__file__); print(e.__file__)")
    out = installed.run(str(installed.bin / "python"), "-c", script)
    assert out.returncode == 0, out.stderr
    for path in out.stdout.split():
        assert Path(path).is_relative_to(installed.venv), path
        assert not Path(path).is_relative_to(ROOT), path


PROFILES = ('class A = type == "a"\nclass B = type == "b"\n'
            "profile S = ((all_dup(A); all_dup(B))_5s)_all_pairs\n")


@pytest.mark.slow
@pytest.mark.xdist_group("install")
def test_check_and_replay_from_outside_the_repository(installed: Installed) -> None:
    shutil.copy(ROOT / "examples" / "logistics" / "profiles.eva", installed.work / "logistics.eva")
    out = installed.run(str(installed.bin / "evamed"), "check", "logistics.eva")
    assert out.returncode == 0, out.stderr
    assert "P1" in out.stdout and "P7" in out.stdout

    (installed.work / "p.eva").write_text(PROFILES)
    events = [{"specversion": "1.0", "id": ident, "source": "urn:test", "type": kind,
               "time": f"2026-03-02T10:00:{second:02d}Z"}
              for ident, kind, second in (("a1", "a", 1), ("b1", "b", 3), ("a2", "a", 10))]
    (installed.work / "e.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    out = installed.run(str(installed.bin / "evamed"), "replay", "--profiles", "p.eva",
                        "--events", "e.jsonl")
    assert out.returncode == 0, out.stderr
    here = CliRunner().invoke(app, ["replay", "--profiles", str(installed.work / "p.eva"),
                                    "--events", str(installed.work / "e.jsonl")])
    assert out.stdout == here.stdout  # the installed engine answers exactly as this tree's
    assert [json.loads(line)["data"]["constituents"] for line in out.stdout.splitlines()] == [
        ["a1", "b1"]]


CLIENT = """
import sys
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from adapters.wire import SERVICE_NAME, base_pb2, base_pb2_grpc
with grpc.insecure_channel(sys.argv[1]) as channel:
    grpc.channel_ready_future(channel).result(timeout=30)
    reply = base_pb2_grpc.BaseServiceStub(channel).Capabilities(base_pb2.CapabilitiesRequest(),
                                                                 timeout=30)
    health = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=30)
    print(reply.group, reply.language, health_pb2.HealthCheckResponse.ServingStatus.Name(health.status))
"""


@pytest.mark.slow
@pytest.mark.xdist_group("install")
def test_a_base_service_answers_a_client_from_outside_the_repository(installed: Installed) -> None:
    proc = subprocess.Popen([str(installed.bin / "evamed"), "base-service", "--group", "cg2",
                             "--listen", "127.0.0.1:0"], cwd=installed.work, env=installed.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the service prints its address once it listens
        assert line.startswith("serving cg2 on 127.0.0.1:"), (line, proc.poll())
        out = installed.run(str(installed.bin / "python"), "-c", CLIENT, line.split()[-1])
        assert (out.returncode, out.stdout) == (0, "cg2 snoop SERVING\n"), out.stderr
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr


# ---------------------------------------------------------------------------------------------
# The core install: the wheel with its own dependencies only — no extra. They are taken from the
# development environment (nothing is downloaded): the closure of the wheel's unconditional
# requirements, each distribution's files linked into a directory of their own.

HEAVY = ("pyspark", "pyarrow", "pandas", "matplotlib", "numpy", "py4j", "sqlglotc")
"""What the core install must not bring (the extras' packages and what only they need)."""
CORE_MB = 150
"""The core install's budget (issue 25): the wheel and its dependencies, in MB."""


def _core_closure(wheel: Path) -> list[Any]:
    """The distributions the wheel's unconditional requirements need, transitively (markers
    evaluated here, extras only where a requirement names them)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        requires = [v for k, v in email.message_from_bytes(archive.read(name)).items()
                    if k == "Requires-Dist"]
    found: dict[tuple[str, str], Any] = {}
    pending = [(Requirement(r), "") for r in requires]
    while pending:
        requirement, extra = pending.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": extra}):
            continue
        key = re.sub(r"[-_.]+", "-", requirement.name).lower()
        dist = metadata.distribution(requirement.name)
        for wanted in requirement.extras or {""}:
            if (key, wanted) in found:
                continue
            found[(key, wanted)] = dist
            pending += [(Requirement(r), wanted) for r in dist.requires or []]
    return list({id(d): d for d in found.values()}.values())


@dataclass
class Core:
    installed: Installed
    names: set[str]   # the distributions found
    megabytes: float  # the wheel installed, and its dependencies' files


@pytest.fixture(scope="module")
def core(wheel: tuple[Path, dict[str, float]], tmp_path_factory: pytest.TempPathFactory) -> Core:
    start = time.monotonic()
    base = tmp_path_factory.mktemp("core")
    deps = base / "dependencies"
    deps.mkdir()
    closure = _core_closure(wheel[0])
    size = 0
    for dist in closure:
        for file in dist.files or []:
            path = Path(dist.locate_file(file)).resolve()
            if path.is_file():
                size += path.stat().st_size
            top = deps / Path(file).parts[0]
            if not top.exists() and ".." not in Path(file).parts:
                top.symlink_to(Path(dist.locate_file(Path(file).parts[0])))
    installed = _install(base, wheel[0], deps)
    size += sum(f.stat().st_size for f in installed.venv.rglob("*")
                if f.is_file() and not f.is_symlink())
    wheel[1]["core install"] = time.monotonic() - start
    names = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower() for d in closure}
    print(f"\ncore install: {len(names)} distributions, {size / 1e6:.0f} MB: "
          f"{', '.join(sorted(names))}")
    return Core(installed, names, size / 1e6)


@pytest.mark.slow
@pytest.mark.xdist_group("install")
def test_the_wheel_declares_its_licence_and_its_extras(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as archive:
        names = archive.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        fields = email.message_from_bytes(archive.read(meta))
        (licence,) = [n for n in names if n.endswith("/LICENSE")]
        assert archive.read(licence) == (ROOT / "LICENSE").read_bytes()
    assert fields["License-Expression"] == "MIT"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert {"spark", "plots", "fast", "dev"} <= set(fields.get_all("Provides-Extra") or [])
    unconditional = [r for r in fields.get_all("Requires-Dist") or [] if ";" not in r]
    assert not [r for r in unconditional if r.split("[")[0].split("=")[0].split("<")[0]
                .split(">")[0].strip().lower() in HEAVY]


@pytest.mark.slow
@pytest.mark.xdist_group("install")
def test_the_core_install_needs_no_extra_and_fits_the_budget(core: Core) -> None:
    assert not core.names & set(HEAVY), core.names & set(HEAVY)
    assert core.megabytes <= CORE_MB, core.megabytes
    found = core.installed.run(str(core.installed.bin / "python"), "-c",
                               "import importlib.util as u; print([m for m in "
                               f"{list(HEAVY)!r} if u.find_spec(m)])")
    assert found.stdout.strip() == "[]", found.stdout + found.stderr


@pytest.mark.slow
@pytest.mark.xdist_group("install")
def test_a_feature_that_needs_an_extra_names_it_in_one_line(core: Core) -> None:
    run = core.installed
    (run.work / "p.eva").write_text(PROFILES)
    (run.work / "e.jsonl").write_text('{"specversion": "1.0", "id": "a1", "source": "s", '
                                      '"type": "a", "time": "2026-03-02T10:00:00Z"}\n')
    evamed = str(run.bin / "evamed")
    spark = "needs the spark extra (pyspark, pandas, pyarrow are not installed): pip install 'evamed[spark]'"
    plots = "needs the plots extra (matplotlib is not installed): pip install 'evamed[plots]'"
    for argv, wanted in (
            ([evamed, "serve", "--composer", "spark"], f'composer = "spark" {spark}'),
            ([evamed, "replay", "--profiles", "p.eva", "--events", "e.jsonl", "--engine",
              "spark"], f"--engine spark {spark}"),
            ([evamed, "demo"], spark),
            ([evamed, "replay", "--profiles", "p.eva", "--events", "e.jsonl", "--plot", "x.png"],
             f"--plot {plots}"),
            ([evamed, "explain", "--profiles", "p.eva", "--group", "cg1", "--plot", "x.png"],
             f"--plot {plots}")):
        out = run.run(*argv)
        assert out.returncode == 2, (argv, out.stdout, out.stderr)
        assert wanted in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "Traceback" not in out.stderr


@pytest.mark.slow
@pytest.mark.xdist_group("install")
def test_the_core_install_serves_subscribes_and_publishes(core: Core) -> None:
    """`evamed serve` with no configuration (the in-process composer), a token saved with
    `clients add --save`, a profile subscribed and its composite delivered: the core install
    is the mediator, not only a client."""
    run = core.installed
    evamed = str(run.bin / "evamed")
    (run.work / "p.eva").write_text(PROFILES)
    events = [{"specversion": "1.0", "id": ident, "source": "urn:test", "type": kind,
               "time": f"2026-03-02T10:00:{second:02d}Z"}
              for ident, kind, second in (("a1", "a", 1), ("b1", "b", 3))]
    (run.work / "e.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    port = _free_port()
    env = {**run.env, "EVAMED_LISTEN": f"127.0.0.1:{port}", "EVAMED_SERVER": f"127.0.0.1:{port}"}
    added = subprocess.run([evamed, "clients", "add", "alice", "--operator", "--save"], cwd=run.work, env=env,
                           capture_output=True, text=True, timeout=60)
    assert added.returncode == 0, added.stderr
    server = subprocess.Popen([evamed, "serve"], cwd=run.work, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        assert server.stdout.readline() == f"serving on 127.0.0.1:{port}\n"
        tail = subprocess.Popen([evamed, "subscribe", "S", "--file", "p.eva"], cwd=run.work,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(1)  # registered before the events come
            done = subprocess.run([evamed, "publish", "e.jsonl", "--advance-to",
                                   "2026-03-02T10:01:00Z"], cwd=run.work, env=env,
                                  capture_output=True, text=True, timeout=60)
            assert done.stdout == "accepted 2, dead-lettered 0\n", done.stderr
            assert tail.stdout is not None
            ready, _, _ = select.select([tail.stdout], [], [], 60)
            assert ready, "no composite within 60 s"
            note = json.loads(tail.stdout.readline())
            assert note["cloudevent"]["data"]["constituents"] == ["a1", "b1"]
        finally:
            tail.terminate()
            tail.communicate(timeout=30)
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=30)
    assert server.returncode == 0, stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
