"""`mlxcluster train --data DIR` on three lab hosts, each with its own disk:
the token folder prepared on this machine is missing on two hosts, sent
(rsync to one, a plain ssh stream to the host without rsync), verified and
trained on; a damaged copy on one host is found by its sha256 and replaced;
a host without the room is refused before anything is sent."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from reference_train.prepare import prepare_offline
from tests import waits
from tests.hub_cache_support import cache_model
from tests.lab.jobs import training_setup

pytestmark = pytest.mark.lab


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def train(lab, tmp_path, data: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    inventory, env = training_setup(lab, tmp_path)
    return waits.run(
        [sys.executable, "-m", "mlxcluster", "train", "-i", str(inventory), "--no-preflight",
         "--config", "tiny", "--stall-timeout", "60s", *flags, "--", "--steps", "4",
         "--global_batch", "6", "--eval_every", "0", "--sample_tokens", "0", "--data", str(data),
         "--out", str(out)],
        env=env, cwd=tmp_path)


def path_without_rsync(lab, folder: Path) -> str:
    """A PATH like the host's, with every program of /usr/bin but rsync."""
    folder.mkdir()
    for name in os.listdir("/usr/bin"):
        if name != "rsync":
            (folder / name).symlink_to(Path("/usr/bin") / name)
    return f"{lab.bin_dir}:{Path(lab.default_python).parent}:{folder}"


def test_data_missing_on_two_hosts_is_sent_verified_and_trained_on(lab3, tmp_path):
    data = lab3.disk / f"data-{uuid.uuid4().hex[:6]}"
    prepare_offline(data, n_stories=200)  # on this machine's own disk
    files = ["train.bin", "val.bin", "meta.json"]
    # labhost1 has its copy already; labhost2 and labhost3 have none.
    first = lab3.host_disk(lab3.hosts[0]) / data.name
    first.mkdir()
    for name in files:
        (first / name).write_bytes((data / name).read_bytes())
    # labhost3 has no rsync: its copy goes as a plain stream over ssh.
    lab3.set_host_path(lab3.hosts[2], path_without_rsync(lab3, tmp_path / "bin-no-rsync"))
    try:
        assert "rsync" not in lab3.ssh(lab3.hosts[2], "command -v rsync || echo none").stdout.replace(
            "none", "")
        proc = train(lab3, tmp_path, data, lab3.disk / f"run-{uuid.uuid4().hex[:6]}")
    finally:
        lab3.heal(lab3.hosts[2])
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-3000:]
    assert f"data: labhost1 has {data}" in said
    assert f"data: labhost2: {data} missing: sending 3 file(s)" in said
    assert f"data: labhost3: {data} missing: sending 3 file(s)" in said
    assert "data: labhost2: sent" in said and "by rsync, sha256 verified there" in said
    assert "by ssh stream, sha256 verified there" in said.split("data: labhost3: sent")[1]
    for h in lab3.hosts:  # every host's own disk holds the same bytes now
        for name in files:
            assert sha(lab3.host_disk(h) / data.name / name) == sha(data / name), (h.name, name)
        assert not list((lab3.host_disk(h) / data.name).glob(".incoming*"))
    assert "step      4/4" in said  # trained on

    # A damaged copy: one byte of labhost3's train.bin changed. Found by its
    # sha256 (same size), replaced, and the job trains again.
    damaged = lab3.host_disk(lab3.hosts[2]) / data.name / "train.bin"
    raw = bytearray(damaged.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    damaged.write_bytes(bytes(raw))
    proc = train(lab3, tmp_path, data, lab3.disk / f"run-{uuid.uuid4().hex[:6]}")
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-3000:]
    assert f"data: labhost3: {data} train.bin different: sending 1 file(s)" in said
    assert f"data: labhost1 has {data}" in said and f"data: labhost2 has {data}" in said
    assert sha(damaged) == sha(data / "train.bin")


def test_a_host_without_room_for_the_data_is_refused_before_anything_is_sent(lab3, tmp_path):
    data = lab3.disk / f"data-{uuid.uuid4().hex[:6]}"
    prepare_offline(data, n_stories=200)
    # labhost2's data folder is a 16 KiB disk of its own (a tmpfs in its mount namespace).
    small = lab3.ssh(lab3.hosts[1], f"mkdir -p {data} && mount -t tmpfs -o size=16k tmpfs {data} "
                                    "&& echo mounted")
    assert "mounted" in small.stdout, small.stderr
    try:
        proc = train(lab3, tmp_path, data, lab3.disk / f"run-{uuid.uuid4().hex[:6]}")
        left = {h.name: lab3.ssh(h, f"ls -A {data} 2>/dev/null").stdout.split() for h in lab3.hosts}
    finally:
        lab3.ssh(lab3.hosts[1], f"umount {data}")
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2, said[-3000:]
    need = (data / "train.bin").stat().st_size + (data / "val.bin").stat().st_size + \
        (data / "meta.json").stat().st_size
    assert f"error: not enough free space for the data: labhost2 needs {need / 1000:.1f} KB for " \
           f"{data} and has 16.4 KB free (nothing was sent)" in said, said[-2000:]
    assert "Traceback" not in said and "launching" not in said
    assert left == {"labhost1": [], "labhost2": [], "labhost3": []}  # nothing was sent anywhere


# A model sent as serve and train send one (launch/sync.py), by a process of its
# own that a test can kill as a closed laptop lid or Ctrl-C would.
SEND_MODEL = """
import os, sys
from types import SimpleNamespace
from mlxcluster.inventory.inventory import load_inventory
from mlxcluster.jobs.hosts import hosts_from_inventory
from mlxcluster.launch.sync import send_where_needed
from mlxcluster.transfer.manifest import folder_manifest
hosts = hosts_from_inventory(load_inventory(sys.argv[1]))
send_where_needed(SimpleNamespace(hosts=hosts), folder_manifest(sys.argv[2]), "model",
                  dict(os.environ), lambda e: print(getattr(e, "text", ""), flush=True))
"""
CHUNK = 1 << 20  # the agent's read (mlxcluster/transfer/agent.py): at most this is lost


def test_a_model_send_cut_mid_file_resumes_at_the_byte(lab3, tmp_path):
    """The link to a host taken down mid-file and the sender killed with it:
    the next send of the model sends only the rest (the host's own interface
    counter says how many bytes it received), the copy there is whole and
    its sha256 the model's. The cut send's agent on the host, still waiting
    on its dead connection, writes into nothing the new send uses."""
    lab = lab3
    host = lab.hosts[2]
    inventory, env = training_setup(lab, tmp_path, hosts=[host])
    model = lab.disk / f"resume-{uuid.uuid4().hex[:8]}"  # this machine's disk only
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(os.urandom(24 << 20))
    weights = sha(model / "model.safetensors")
    there = lab.host_disk(host) / model.relative_to(lab.disk)
    parts = there / ".mlxcluster-partial"
    script = tmp_path / "send_model.py"
    script.write_text(SEND_MODEL)

    def received() -> int:
        return int(lab.netns_exec(host, ["cat", "/sys/class/net/eth0/statistics/rx_bytes"]).stdout)

    def part_bytes() -> int:
        return max((p.stat().st_size for p in parts.glob(f"{weights}.*")), default=0)

    # The bytes towards the host slowed (the lab end of its cable) so that the cut lands mid-file.
    shaped = ["tc", "qdisc", "replace", "dev", host.veth, "root", "tbf", "rate", "40mbit",
              "burst", "32kbit", "latency", "400ms"]
    subprocess.run(shaped, check=True, timeout=30)
    try:
        sender = subprocess.Popen([sys.executable, str(script), str(inventory), str(model)], env=env,
                                  cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
        waits.poll_until(lambda: part_bytes() >= 8 << 20, 120, "8 MB of the model on the host",
                         interval=0.05)
        lab.link_down(host)
        sender.kill()
        first = sender.communicate(timeout=60)[0]
        lab.heal(host)
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", host.veth, "root"], check=False, timeout=30)
    left = part_bytes()
    assert 8 << 20 <= left < 24 << 20, (left, first)
    assert not (there / "model.safetensors").exists()  # a part is never taken for whole

    before = received()
    again = waits.run([sys.executable, str(script), str(inventory), str(model)], "the send again",
                      env=env, cwd=tmp_path)
    took = received() - before
    assert again.returncode == 0, again.stdout + again.stderr
    rest = (24 << 20) - left + len('{"model_type": "llama"}')
    assert "sending 2 file(s)" in again.stdout and "resuming: " in again.stdout, again.stdout
    assert "by ssh stream, sha256 verified there" in again.stdout, again.stdout
    # TCP/IP and ssh framing (~4%), the check and the agent's source (~50 KB a call)
    assert took <= 1.06 * (rest + CHUNK) + 300_000, (took, rest, again.stdout)
    assert sha(there / "model.safetensors") == weights and not parts.exists()


def test_pull_puts_a_cached_hugging_face_id_on_every_host(lab3, tmp_path):
    """`HF_HUB_OFFLINE=1 mlxcluster pull ORG/NAME` with the model in this
    machine's hub cache (huggingface_hub's layout: blobs, snapshots, refs):
    the snapshot folder on every host's own disk at the same path, each
    file's bytes the blob's (links followed, regular files there)."""
    lab = lab3
    inventory, env = training_setup(lab, tmp_path)
    files = {"config.json": b'{"model_type": "llama"}', "model.safetensors": os.urandom(300_000),
             "tokenizer/tokenizer.json": b"{}"}
    snapshot = cache_model(lab.disk / f"hub-{uuid.uuid4().hex[:8]}", "mlx-community/Tiny-4bit", files)
    for h in lab.hosts:
        assert not lab.host_exists(h, snapshot)
    env.update(HF_HUB_CACHE=str(snapshot.parents[2]), HF_HUB_OFFLINE="1")
    done = waits.run([sys.executable, "-m", "mlxcluster", "pull", "-i", str(inventory),
                      "mlx-community/Tiny-4bit"], "mlxcluster pull", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    names = ", ".join(h.name for h in lab.hosts)
    assert done.stdout.splitlines()[-1] == f"mlx-community/Tiny-4bit is at {snapshot} here and on {names}"
    for h in lab.hosts:
        there = lab.host_disk(h) / snapshot.relative_to(lab.disk)
        assert {n: (there / n).read_bytes() for n in files} == files
        assert not any((there / n).is_symlink() for n in files)
    again = waits.run([sys.executable, "-m", "mlxcluster", "pull", "-i", str(inventory),
                       "mlx-community/Tiny-4bit"], "mlxcluster pull again", env=env, cwd=tmp_path)
    assert again.returncode == 0 and "sending" not in again.stdout, again.stdout
    assert again.stdout.count("sha256 checked") == len(lab.hosts), again.stdout


def sharded_model(folder: Path, shards: int, shard_bytes: int) -> Path:
    """A model folder as mlx-lm writes a big one: config, an index, shards."""
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    for name in names:
        (folder / name).write_bytes(os.urandom(shard_bytes))
    (folder / "model.safetensors.index.json").write_text(
        '{"weight_map": {' + ", ".join(f'"model.layers.{i}.w": "{n}"' for i, n in enumerate(names)) + "}}")
    return folder


def test_a_model_to_three_hosts_crosses_this_machines_link_once(lab3, tmp_path):
    """`mlxcluster pull DIR` to three hosts: the first gets the model from
    here, the other two take it from the first over the hosts' own link at
    once; the bytes this machine sends (its side of the lab's network) are
    one copy's, not three; every copy's sha256 is the model's. The time it
    takes against one host: bench/pull_fanout.py."""
    lab = lab3
    inventory, env = training_setup(lab, tmp_path)
    model = sharded_model(lab.disk / f"fan-{uuid.uuid4().hex[:8]}", 4, 6 << 20)
    files = {p.name: sha(p) for p in model.iterdir()}
    total = sum(p.stat().st_size for p in model.iterdir())

    def sent_from_here() -> int:
        return int(Path(f"/sys/class/net/{lab.bridge}/statistics/tx_bytes").read_text())

    before = sent_from_here()
    done = waits.run([sys.executable, "-m", "mlxcluster", "pull", "-i", str(inventory), str(model)],
                     "mlxcluster pull", env=env, cwd=tmp_path)
    crossed = sent_from_here() - before
    assert done.returncode == 0, done.stdout + done.stderr
    first, *others = [h.name for h in lab.hosts]
    assert (f"model: plan: here -> {first} over this machine's link, then {first} -> "
            f"{', '.join(others)} over {lab.hosts[0].ip} ({first}'s data IP), at once") in done.stdout
    for name in others:
        assert re.search(rf"model: {name}: took 25\.\d MB in [\d.]+ s \(.*\) over the hosts' link "
                         rf"from {first} \({re.escape(lab.hosts[0].ip)}\), sha256 verified there",
                         done.stdout), done.stdout
    for h in lab.hosts:
        there = lab.host_disk(h) / model.relative_to(lab.disk)
        assert {p.name: sha(p) for p in there.iterdir() if not p.name.startswith(".")} == files
    # one copy and its ssh, TCP and IP framing (~4%), the checks and the agents' source;
    # three copies would be 3x
    assert crossed < 1.2 * total, (crossed, total)
    assert lab.host_processes(lab.hosts[0]) == [], "the offer ended with the pull"


def test_pull_download_on_a_host_sends_nothing_of_the_model_through_this_machine(lab3, tmp_path):
    """`mlxcluster pull --download-on labhost1 ORG/NAME`: labhost1 resolves
    the id in its own Hugging Face cache (on its own disk; HF_HUB_CACHE from
    the inventory's env, HF_HUB_OFFLINE=1 from here), hashes it there, and
    the other two take it from labhost1 over the hosts' link: every copy the
    snapshot's bytes as regular files, no copy here, and this machine's side
    of the lab's network sends a small part of one copy (ssh and the agent's
    source), not the model. A host whose cache lacks the id, or a host not in
    the job: exit 2, named."""
    lab = lab3
    cache = lab.disk / f"hub-{uuid.uuid4().hex[:8]}"
    inventory = lab.write_inventory(tmp_path / "inventory.yaml", env={"HF_HUB_CACHE": str(cache)})
    env = {**lab.env(), "HF_HUB_OFFLINE": "1"}
    env.pop("LD_PRELOAD", None)
    files = {"config.json": b'{"model_type": "llama"}', "model.safetensors": os.urandom(8 << 20),
             "tokenizer/tokenizer.json": b"{}"}
    first, *others = lab.hosts
    on_first = cache_model(lab.host_disk(first) / cache.relative_to(lab.disk), "mlx-community/Tiny-4bit", files)
    snapshot = lab.disk / on_first.relative_to(lab.host_disk(first))

    def sent_from_here() -> int:
        return int(Path(f"/sys/class/net/{lab.bridge}/statistics/tx_bytes").read_text())

    before = sent_from_here()
    done = waits.run([sys.executable, "-m", "mlxcluster", "pull", "-i", str(inventory),
                      "--download-on", first.name, "mlx-community/Tiny-4bit"],
                     "mlxcluster pull --download-on", env=env, cwd=tmp_path)
    crossed = sent_from_here() - before
    assert done.returncode == 0, done.stdout + done.stderr
    names = ", ".join(h.name for h in lab.hosts)
    assert done.stdout.splitlines()[-1] == (f"mlx-community/Tiny-4bit is at {snapshot} on {names} "
                                            f"(downloaded on {first.name}; not here)"), done.stdout
    assert (f"model: plan: {first.name} -> {', '.join(h.name for h in others)} over {first.ip} "
            f"({first.name}'s data IP), at once; nothing through this machine") in done.stdout
    for h in others:
        there = lab.host_disk(h) / snapshot.relative_to(lab.disk)
        assert {n: (there / n).read_bytes() for n in files} == files
        assert not any((there / n).is_symlink() for n in files)
    assert not cache.exists(), "no copy here"
    total = sum(len(b) for b in files.values())
    assert crossed < 0.15 * total, (crossed, total)  # ~0.1 MB of ssh and agent source per call
    assert lab.host_processes(first) == [], "the offer ended with the pull"

    missing = waits.run([sys.executable, "-m", "mlxcluster", "pull", "-i", str(inventory),
                         "--download-on", others[0].name, "mlx-community/Other-4bit"],
                        "mlxcluster pull --download-on (not cached)", env=env, cwd=tmp_path)
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert (f"--download-on {others[0].name}: mlx-community/Other-4bit is not in its Hugging Face "
            f"cache ({cache}), and HF_HUB_OFFLINE is set") in missing.stderr, missing.stderr
    assert "Traceback" not in missing.stderr
    nowhere = waits.run([sys.executable, "-m", "mlxcluster", "pull", "-i", str(inventory),
                         "--download-on", "mac9", "mlx-community/Tiny-4bit"],
                        "mlxcluster pull --download-on (no such host)", env=env, cwd=tmp_path)
    assert nowhere.returncode == 2 and f"name one of {names}" in nowhere.stderr, nowhere.stderr
