"""The lab's fixtures (tests/lab/__init__.py builds the lab; docs/testing.md
says which to use).

- ``lab3``, ``lab3_own_tmp`` and ``lab3_own_home``: three hosts started once per test process
  (once per xdist worker) and shared by every lab test of that process.
  A test may change them (a link down, sshd stopped, another mlx...) but
  must put back what it changed: ``_shared_lab_as_it_was`` compares the
  lab before and after every test that uses one, and fails the test that
  left it changed (then restores the lab for the next test).
- ``make_lab(n, ...)``: hosts of a test's own, for what the shared labs
  cannot be (another host count, own_ssh, no_project), torn down after it.
- ``two_macs``: two hosts of a test's own set up one by one, the second on
  an older mlx without mlx-lm (tests/lab/two_macs.py).
"""

from __future__ import annotations

import time

import pytest

from reference_train.prepare import prepare_offline
from tests.conftest import require
from tests.waits import LAB_SETTLE_S, POLL_S

SHARED_LABS = ("lab3", "lab3_own_tmp", "lab3_own_home")


def _require_lab() -> None:
    from tests.lab import lab_unavailable_reason

    reason = lab_unavailable_reason()
    require(reason is None, f"lab unavailable: {reason}")


@pytest.fixture(scope="session")
def lab3():
    """Three real sshd hosts in network namespaces, each with its own disk,
    shared by every test of this process."""
    _require_lab()
    from tests.lab import start_lab

    with start_lab(3) as lab:
        yield lab


@pytest.fixture(scope="session")
def lab3_own_tmp():
    """Like ``lab3``, and every host's /tmp is its own too (``Lab.own_tmp``):
    smoke stages its worker and keeps its ranks' files under /tmp on each
    host, as on Macs."""
    _require_lab()
    from tests.lab import start_lab

    with start_lab(3, own_tmp=True) as lab:
        yield lab


@pytest.fixture(scope="session")
def lab3_own_home():
    """Like ``lab3``, and every host has a HOME of its own (``Lab.no_project``:
    no copy of this project either), as each Mac has its own ~/.cache: what
    a fix sends to one host's home is on that host only, and nothing is
    read from or written to this machine's home."""
    _require_lab()
    from tests.lab import start_lab

    with start_lab(3, no_project=True) as lab:
        yield lab


@pytest.fixture
def make_lab():
    """Factory: ``make_lab(n, **options)`` starts an n-host lab of the test's
    own, torn down after the test."""
    _require_lab()
    from tests.lab import start_lab

    stack = []

    def factory(n: int, **kwargs):
        cm = start_lab(n, **kwargs)
        lab = cm.__enter__()
        stack.append(cm)
        return lab

    yield factory
    while stack:
        stack.pop().__exit__(None, None, None)


@pytest.fixture
def two_macs(make_lab, tmp_path, monkeypatch):
    """Two hosts set up one by one, labhost2 on an older mlx without mlx-lm,
    and a folder holding ./cluster.yaml where the user types
    (tests/lab/two_macs.py: ``TwoMacs``)."""
    from tests.lab.two_macs import two_macs_from_zero

    with two_macs_from_zero(make_lab, tmp_path, monkeypatch) as macs:
        yield macs


def _differences(before: dict, after: dict) -> list[str]:
    """What changed, an aspect a line (for lists of lines: those gone and those new)."""
    said = []
    for key in sorted(set(before) | set(after)):
        was, now = before.get(key), after.get(key)
        if was == now:
            continue
        if isinstance(was, list) and isinstance(now, list):
            said.append(f"{key}: gone {[x for x in was if x not in now]}, new {[x for x in now if x not in was]}")
        else:
            said.append(f"{key}: {was!r} -> {now!r}")
    return said


@pytest.fixture(autouse=True)
def _shared_lab_as_it_was(request):
    """Every test that uses a shared lab leaves it as it found it."""
    labs = [request.getfixturevalue(name) for name in SHARED_LABS if name in request.fixturenames]
    before = [lab.fingerprint() for lab in labs]
    yield
    changed = []
    for lab, was in zip(labs, before, strict=True):
        deadline = time.monotonic() + LAB_SETTLE_S
        while (now := lab.fingerprint()) != was and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if now != was:
            changed += [f"lab {lab.id}: {line}" for line in _differences(was, now)]
            lab.kill_host_processes()  # the next test gets the lab as it was
            lab.heal()
    if changed:
        pytest.fail("the test left the shared lab changed:\n" + "\n".join(changed), pytrace=False)


@pytest.fixture(scope="session")
def lab_data(tmp_path_factory):
    """A small token dataset on this machine that lab runs send to the hosts
    (``tests.lab.jobs.data_here``)."""
    out = tmp_path_factory.mktemp("labdata") / "offline"
    prepare_offline(out, n_stories=300)
    return out


@pytest.fixture
def lab_inventory(request, tmp_path):
    """The test's shared lab (``lab3_own_tmp`` when the test uses it, else
    ``lab3``) as an inventory, with the module's ``INVENTORY_ENV`` (if any)
    as its ``env:`` block."""
    lab = request.getfixturevalue("lab3_own_tmp" if "lab3_own_tmp" in request.fixturenames else "lab3")
    return lab.write_inventory(tmp_path / "shared-lab.yaml", env=getattr(request.module, "INVENTORY_ENV", None))


@pytest.fixture
def short_lease(monkeypatch):
    """mlxcluster's environment (lab.env copies it) with the tests' lease
    (tests/waits.py LEASE_TEST_S): the ranks of a controller a test kills,
    cuts off or fails with, end within seconds instead of the default 30."""
    from mlxcluster.jobs.rank_wrapper import LEASE_GRACE_VAR, LEASE_VAR
    from tests.waits import LEASE_TEST_S

    monkeypatch.setenv(LEASE_VAR, str(LEASE_TEST_S))
    monkeypatch.setenv(LEASE_GRACE_VAR, "30")
