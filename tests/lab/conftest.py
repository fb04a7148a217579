"""Fixtures shared by the lab tests (the lab itself: tests/conftest.py)."""

from __future__ import annotations

import pytest

from reference_train.prepare import prepare_offline


@pytest.fixture(scope="session")
def lab_data(tmp_path_factory):
    """A small token dataset the trainer reads on every lab host (shared filesystem)."""
    out = tmp_path_factory.mktemp("labdata") / "offline"
    prepare_offline(out, n_stories=300)
    return out
