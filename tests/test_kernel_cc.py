"""The test machine's g++ for MLX's CPU kernels (tests/kernel_cc/g++, issue 50): processes
that meet the same kernel at once build it once, and each loads a working library."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.busy import main as busy_main
from tests.busy import spinner_name
from tests.conftest import require

KERNEL_CC = Path(__file__).resolve().parent / "kernel_cc"
REAL_GXX = shutil.which("g++", path=os.environ.get("PATH", "").replace(str(KERNEL_CC), ""))

# exp(x) * 2 + 1, compiled: MLX builds one kernel for it on the CPU.
PROGRAM = """
import mlx.core as mx
mx.set_default_device(mx.cpu)
f = mx.compile(lambda x: mx.exp(x) * 2 + 1)
print(round(f(mx.zeros(4))[0].item(), 4))
"""


def counting_gxx(folder: Path, code: int | None = None) -> Path:
    """A g++ after the wrapper on PATH that logs each build, then runs the real one
    (or fails with ``code``)."""
    folder.mkdir()
    log = folder / "builds.log"
    tail = f"exit {code}" if code is not None else f'exec {REAL_GXX} "$@"'
    script = folder / "g++"
    script.write_text(f'#!/bin/sh\ncase "$*" in *-o*) echo "$*" >> {log} ;; esac\n{tail}\n')
    script.chmod(0o755)
    return log


def env_with(tmp_path: Path, counter: Path) -> dict[str, str]:
    others = [p for p in os.environ["PATH"].split(os.pathsep) if p != str(KERNEL_CC)]
    return {**os.environ, "TMPDIR": str(tmp_path / "tmp"),
            "PATH": os.pathsep.join([str(KERNEL_CC), str(counter), *others])}


def test_two_processes_meeting_one_kernel_build_it_once_and_both_load_it(tmp_path):
    require(REAL_GXX is not None, "g++ (MLX builds its CPU kernels with it)")
    log = counting_gxx(tmp_path / "cc")
    (tmp_path / "tmp").mkdir()
    env = env_with(tmp_path, tmp_path / "cc")
    procs = [subprocess.Popen([sys.executable, "-c", PROGRAM], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    said = [proc.communicate(timeout=120) for proc in procs]
    assert [out.strip() for out, _ in said] == ["3.0"] * 3, said
    assert len(kernel_builds(log)) == 1  # one build for the three
    assert len(list((tmp_path / "tmp" / "mlx" / "builds").glob("*.so"))) == 1
    # A later process builds nothing: MLX finds its library in its own folder.
    again = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True,
                           text=True, timeout=120)
    assert again.stdout.strip() == "3.0" and len(kernel_builds(log)) == 1


def kernel_builds(log: Path) -> list[str]:
    """The logged builds of a kernel's library (not of the precompiled preamble)."""
    return [line for line in log.read_text().splitlines() if "c++-header" not in line]


def stripped(library: Path, tmp_path: Path) -> bytes:
    """The library without its symbol table, which names the source MLX wrote (a
    random file name: tmp_<hex>.cpp); what runs is all that is left."""
    out = tmp_path / f"{library.stem}-{library.parent.parent.parent.name}.stripped"
    subprocess.run(["strip", "-o", str(out), str(library)], check=True, timeout=60)
    return out.read_bytes()


def test_the_preamble_is_precompiled_once_and_the_kernels_are_the_same_bytes(tmp_path):
    """MLX's preamble (most of a build's time) is precompiled once per include folder;
    each kernel built with it is the library g++ builds without it, byte for byte; a
    .gch that g++ cannot use costs a parse, not a kernel."""
    require(REAL_GXX is not None, "g++ (MLX builds its CPU kernels with it)")
    runs = {}
    for name, switch in [("pch", "1"), ("plain", "0")]:
        log = counting_gxx(tmp_path / f"cc-{name}")
        (tmp_path / name / "tmp").mkdir(parents=True)
        env = {**env_with(tmp_path / name, tmp_path / f"cc-{name}"), "MLXCLUSTER_KERNEL_PCH": switch}
        done = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.stdout.strip() == "3.0", done.stderr
        builds = tmp_path / name / "tmp" / "mlx" / "builds"
        runs[name] = (log, env, builds)
    log, env, builds = runs["pch"]
    headers = [line for line in log.read_text().splitlines() if "c++-header" in line]
    gch = list(builds.glob("pch-*/mlx/backend/cpu/compiled_preamble.h.gch"))
    assert len(headers) == 1 and len(gch) == 1
    assert f"-I {gch[0].parents[3]}" in kernel_builds(log)[0]
    assert not list(runs["plain"][2].glob("pch-*"))
    [with_pch], [without] = list(builds.glob("*.so")), list(runs["plain"][2].glob("*.so"))
    assert stripped(with_pch, tmp_path) == stripped(without, tmp_path)

    # Another kernel: the preamble is not built again. Then one over a .gch g++ refuses.
    other = PROGRAM.replace("mx.exp(x) * 2 + 1", "mx.tanh(x) + 3")
    for junk in (False, True):
        if junk:
            gch[0].write_bytes(b"not a precompiled header")
            other = other.replace("+ 3", "+ 4")
        done = subprocess.run([sys.executable, "-c", other], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.stdout.strip() == ("4.0" if junk else "3.0"), done.stderr
    assert len(kernel_builds(log)) == 3
    assert [line for line in log.read_text().splitlines() if "c++-header" in line] == headers


def test_a_failed_build_is_not_kept_and_other_calls_reach_the_real_compiler(tmp_path):
    require(REAL_GXX is not None, "g++ (MLX builds its CPU kernels with it)")
    log = counting_gxx(tmp_path / "cc", code=1)
    source = tmp_path / "k.cpp"
    source.write_text("int f() { return 1; }\n")
    env = env_with(tmp_path, tmp_path / "cc")
    (tmp_path / "tmp").mkdir()
    build = [str(KERNEL_CC / "g++"), "-shared", str(source), "-o", str(tmp_path / "k.so")]
    assert subprocess.run(build, env=env, timeout=60).returncode == 1
    assert subprocess.run(build, env=env, timeout=60).returncode == 1  # tried again, not kept
    assert len(log.read_text().splitlines()) == 2
    assert not list((tmp_path / "tmp" / "mlx" / "builds").glob("*.so"))
    version = subprocess.run([str(KERNEL_CC / "g++"), "--version"], env=env, capture_output=True,
                             text=True, timeout=60)
    assert version.returncode == 1 and len(log.read_text().splitlines()) == 2  # passed through


def test_a_busy_run_gives_the_command_s_code_and_leaves_no_busy_process(capsys):
    code = busy_main(["--procs", "2", "--", sys.executable, "-c", "raise SystemExit(3)"])
    assert code == 3
    assert "beside 2 busy process(es): exit 3" in capsys.readouterr().out
    # Its own, by name: `make test-busy` runs this test beside busy processes of its own.
    spinning = subprocess.run(["pgrep", "-f", spinner_name()], capture_output=True, text=True)
    assert spinning.stdout.strip() == ""
