"""docs/quickstart.md, run as written (issue 46, item 1): every ```console
command of the page typed in a bash on this machine, in a work folder holding
./cluster.yaml, against two lab hosts set up one by one (tests/lab/two_macs.py:
each its own disk, HOME and ~/.ssh; labhost2 on an older mlx without mlx-lm),
and every line the page shows found in what the command printed
(tests/lab/quickstart_runner.py: numbers, run ids and the lab's names made
alike). The page's ```sh steps are the user's own set-up; in their place the
test puts what they leave: the hosts of step 1 (the fixture), cluster.yaml
(step 2), a model folder (step 4: the tiny chat Llama under the page's
folder name) and chat rows (step 6).

Needs the package index here (doctor --fix fetches the wheels), as the
two-Macs test does.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

import pytest

from tests.chat_support import write_jsonl
from tests.lab.jobs import assert_nothing_left
from tests.lab.quickstart_runner import run_page
from tests.learning_support import chat_rows
from tests.serve_support import chat_model
from tests.waits import SERVE_UP_S

pytestmark = pytest.mark.lab

PAGE = Path(__file__).resolve().parents[2] / "docs" / "quickstart.md"
MODEL = "models/Llama-3.2-1B-Instruct-4bit"  # the page's folder names
FUSED = "models/Llama-3.2-1B-chat-lora"


def test_the_quickstart_page_runs_as_written(two_macs, llama):
    lab = two_macs.lab
    work = lab.disk / f"mlx-work-{uuid.uuid4().hex[:8]}"  # this machine's own disk
    work.mkdir()
    shutil.copy(two_macs.folder / "cluster.yaml", work / "cluster.yaml")
    chat_model(llama, work / MODEL)  # step 4: the page downloads it
    rows = chat_rows(48)  # step 6: the user's chat rows
    (work / "data" / "chat").mkdir(parents=True)
    write_jsonl(work / "data" / "chat" / "train.jsonl", rows[:40])
    write_jsonl(work / "data" / "chat" / "valid.jsonl", rows[40:])
    names = {h.name: page for h, page in zip(lab.hosts, ("mac1", "mac2"), strict=True)}
    names.update({str(work): "~/mlx-work", lab.default_python: "~/mlx/bin/python",
                  lab.python: "~/mlx/bin/python"})

    # doctor before the fix exits 1 (the failures it names); every other step 0
    typed = run_page(PAGE, work, two_macs.env, names, timeout=900, up_timeout=SERVE_UP_S,
                     exits={0: 1}, record=bool(os.environ.get("QUICKSTART_RECORD")))
    assert [t.code for t in typed][:2] == [1, 0]
    for host in lab.hosts[:2]:  # sent to each Mac's own disk
        assert lab.host_exists(host, work / MODEL / "model.safetensors"), host
        assert lab.host_exists(host, work / FUSED / "model.safetensors"), host
    for name in ("adapters.safetensors", "adapter_config.json"):  # both here, for mlx_lm fuse
        assert (work / "runs" / "chat-lora" / "adapters" / name).is_file()
    run_ids = {m for t in typed for m in re.findall(r"run (mlxserve-[0-9a-f]{10})", t.output)}
    assert len(run_ids) == 2, run_ids
    for run_id in run_ids:
        assert_nothing_left(lab, {"run_id": run_id, "cleanup_problems": []})
