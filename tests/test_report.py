"""The HTML report (mlxcluster/report): escaping of every value from a host,
self-containment, size, the `report` command's inputs, and that a live run
and the replay of its --collect folder say the same things."""

from __future__ import annotations

import json
import re
import sys
import time

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main
from mlxcluster.demo import write_local_inventory
from mlxcluster.doctor.doctor import replay_doctor
from mlxcluster.facts.capture import read_capture_dir
from mlxcluster.report import Report, build_page
from mlxcluster.report.smoke_view import smoke_view
from mlxcluster.report.train_view import train_view
from mlxcluster.topology.topology import build_topology
from tests.report_support import (
    FAILING_CHECKS,
    eight_hosts,
    external_references,
    failing_cluster,
    metrics_rows,
    smoke_doc,
    this_machines_probe,
    write_run,
)

EVIL = "<script>alert('pwned')</script>"


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def probe() -> str:
    return this_machines_probe()


def test_every_value_from_a_host_is_escaped(tmp_path, macos_fixtures, probe):
    root = failing_cluster(macos_fixtures, tmp_path / "captures")
    # A host whose folder name is markup and whose probe reports a markup hostname and
    # python version; another host's raw sw_vers capture holds a script as its build.
    evil_host = root / '<img src=x onerror="alert(1)">'
    (root / "mbp").rename(evil_host)
    doc = json.loads(probe)
    doc["hostname"] = EVIL
    doc["python"]["version"] = "</td><script>x()</script>"
    (evil_host / "probe.json").write_text(json.dumps(doc))
    sw = root / "mini" / "sw_vers.txt"
    sw.write_text(sw.read_text().replace("25G83", EVIL))
    smoke = smoke_doc(ranks=2, backends=("ring",))
    smoke["backends"][0]["status"] = "failed"
    smoke["backends"][0]["reason"] = f"rank 1 on {EVIL}: wrong all_sum"
    smoke["backends"][0]["ranks"][1].update(status="failed", host=EVIL, detail=EVIL, failures=[
        {"op": "all_sum", "dtype": "float32", "size": 1024, "detail": EVIL}])
    (tmp_path / "smoke.json").write_text(json.dumps(smoke))
    run = write_run(tmp_path / "run", metrics_rows(steps=3, ranks=2))
    out = tmp_path / "page.html"

    result = invoke("report", str(root), "--backend", "jaccl", "--smoke", str(tmp_path / "smoke.json"),
                    "--run", str(run), "-o", str(out))

    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert "<script" not in html.lower() and "<img" not in html.lower()
    assert "&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;" in html  # the hostname, as text
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in html  # the host (folder) name, as text
    assert "&lt;/td&gt;&lt;script&gt;x()&lt;/script&gt;" in html  # the python version
    assert "macOS 26.6.2 (&lt;script&gt;" in html  # the capture's build, in the facts and evidence
    # The graphviz drawing names the host too: escaped by graphviz, never markup.
    svg = html[html.index('<section id="topology">'):html.index("</section>", html.index('<section id="topology">'))]
    assert "<svg" in svg and "&lt;img src=x" in svg


def test_the_page_needs_nothing_from_outside(tmp_path, macos_fixtures):
    folder = read_capture_dir(failing_cluster(macos_fixtures, tmp_path / "captures"))
    doctor = replay_doctor(folder.captures, backend="jaccl")
    run = write_run(tmp_path / "run", metrics_rows(steps=40, ranks=2))
    html = build_page(Report(doctor=doctor, topology=build_topology(folder.captures),
                             smoke=smoke_doc(ranks=4), runs=[run]))
    assert external_references(html) == []
    assert set(re.findall(r'href="(.)', html)) <= {"#"}  # links only within the page
    assert html.count("<svg") == 5  # topology, smoke plots, loss, tokens/s, memory
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    # Sections in the order a person needs them.
    order = [html.index(f'id="{s}"') for s in ("verdict", "fix-first", "checks", "facts", "topology",
                                              "smoke", "train-1")]
    assert order == sorted(order)
    for check_id in FAILING_CHECKS:
        assert f'id="fix-{check_id}"' in html
    assert f"{len(FAILING_CHECKS)} check(s) failed" in html


def test_without_graphviz_the_topology_is_a_table(tmp_path, macos_fixtures, monkeypatch):
    folder = read_capture_dir(failing_cluster(macos_fixtures, tmp_path / "captures"))
    monkeypatch.setattr("mlxcluster.report.svg.shutil.which", lambda name: None)
    html = build_page(Report(topology=build_topology(folder.captures)))
    section = html[html.index('<section id="topology">'):]
    assert "<svg" not in section
    assert "no cable" in section and "en6 – en6" in section and "80 Gb/s" in section


def test_topology_html_alone(tmp_path, macos_fixtures):
    root = failing_cluster(macos_fixtures, tmp_path / "captures")
    result = invoke("topology", "--from", str(root), "--json", "--html", str(tmp_path / "t.html"))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["full_mesh"] is False  # --json output stays JSON
    html = (tmp_path / "t.html").read_text()
    assert "topology: ring none through all hosts; 5 slow or missing link(s)" in html
    assert "<svg" in html and 'id="checks"' not in html and external_references(html) == []


def test_eight_hosts_bench_and_300_steps_stay_under_1_mb(tmp_path, macos_fixtures, probe):
    root = eight_hosts(macos_fixtures, tmp_path / "captures", probe)
    (tmp_path / "smoke.json").write_text(json.dumps(smoke_doc(ranks=8)))
    run = write_run(tmp_path / "run", metrics_rows(steps=300, ranks=8))
    out = tmp_path / "page.html"
    started = time.monotonic()
    result = invoke("report", str(root), "--smoke", str(tmp_path / "smoke.json"), "--run", str(run),
                    "-o", str(out))
    seconds = time.monotonic() - started
    assert result.exit_code == 0, result.output
    size = out.stat().st_size
    print(f"8 hosts + 3-backend bench + 300 steps: {size / 1024:.0f} KiB in {seconds:.1f} s",
          file=sys.stderr)
    assert size < 1_000_000
    html = out.read_text()
    assert all(f"mac-studio-{i}.local" in html for i in range(1, 9))
    # Past 4 hosts the drawing shows cables only; the pairs without one are folded below it.
    topology = html[html.index('<section id="topology">'):html.index('<section id="smoke">')]
    drawing = topology[topology.index("<svg"):topology.index("</svg>")]
    assert ">missing<" not in drawing and ">en1 &#45; en3<" in drawing  # graphviz escapes "-"
    assert "26 pairs of hosts without a cable" in topology
    assert html.count("<svg") == 5 and external_references(html) == []


def test_live_and_its_collect_replay_say_the_same(tmp_path):
    live_page, replay_page = tmp_path / "live.html", tmp_path / "replay.html"
    live = invoke("doctor", "--local", "--collect", str(tmp_path / "c"), "--html", str(live_page))
    assert live.exit_code in (0, 1), live.output
    inventory = write_local_inventory(1, tmp_path / "local.yaml", sys.executable)
    replay = invoke("report", str(tmp_path / "c"), "-i", str(inventory), "-o", str(replay_page))
    assert replay.exit_code == 0, replay.output

    def said(html: str) -> list[str]:  # every check's status and evidence, every fact
        start = html.index('id="verdict"')
        body = html[start:html.index("<footer>")]
        return re.findall(r'id="check-[^"]+"|badge \w+">[^<]*|<td[^>]*>[^<]*</td>|<pre[^>]*>[^<]*', body)

    assert said(live_page.read_text()) == said(replay_page.read_text())
    assert "this machine (--local)" in live_page.read_text()
    assert "replay of a --collect folder" in replay_page.read_text()


def test_smoke_correctness_per_op_dtype_and_size():
    doc = smoke_doc(ranks=3, backends=("ring",), lo=1024, hi=4096)
    backend = doc["backends"][0]
    backend["status"] = "failed"
    backend["ranks"][1].update(status="failed", detail="all_sum bfloat16 wrong", failures=[
        {"rank": 1, "op": "all_sum", "dtype": "bfloat16", "size": 2050, "bytes": 4100, "ok": False,
         "bad_index": 7, "got": 3.0, "expected": 6.0}])
    view = smoke_view(doc).backends[0]
    # The counts the worker checks: 1 element, one near LO and one above HI that 3 ranks do not divide.
    assert [(op, dtype, [c for c, _, _ in cells]) for op, dtype, cells in view.grid][:2] == [
        ("all_sum", "float32", [1, 257, 1025]), ("all_sum", "bfloat16", [1, 515, 2050])]
    assert view.grid[1][2][2] == (2050, 4100, [1])  # failed on rank 1
    assert all(bad == [] for _, _, cells in view.grid[2:] for _, _, bad in cells)
    html = build_page(Report(smoke=doc))
    assert "✗ 2050 (4100 B): rank 1" in html and "✓ 1025 (4096 B)" not in html
    assert "element 7: got 3.0, expected 6.0" in html and "2050 el. (4100 B)" in html


def test_training_numbers():
    view = train_view(metrics_rows(steps=100, ranks=3, eval_every=50), "run-a")
    assert (view.steps, view.ranks) == (100, 3)
    assert view.first_loss > view.last_loss and view.last_val == pytest.approx(view.last_loss + 0.1)
    assert view.peak_mem_mb == [8123.4 + 50, 8133.4 + 50, 8143.4 + 50]
    assert 50_000 < view.tokens_per_s < 53_000
    empty = train_view([], "nothing")
    assert empty.notes and empty.loss_plot is None


def test_report_input_errors_exit_2_before_writing(tmp_path, macos_fixtures):
    root = failing_cluster(macos_fixtures, tmp_path / "captures")
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "other.json").write_text('{"checks": []}')
    (tmp_path / "norun").mkdir()
    out = tmp_path / "page.html"
    cases = [
        ((), "nothing to report"),
        ((str(root), "--smoke", str(tmp_path / "bad.json")), "is not JSON"),
        ((str(root), "--smoke", str(tmp_path / "other.json")), "not a smoke --json document"),
        ((str(root), "--run", str(tmp_path / "norun")), "no metrics.jsonl"),
    ]
    for args, message in cases:
        result = CliRunner().invoke(main, ["report", *args, "-o", str(out)])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output and "fix:" in result.output
        assert not out.exists()
    result = CliRunner().invoke(main, ["report", str(root), "-o", str(tmp_path / "no" / "page.html")])
    assert result.exit_code == 2 and "does not exist" in result.output


def test_doctor_json_stays_json_with_html(tmp_path, macos_fixtures):
    root = failing_cluster(macos_fixtures, tmp_path / "captures")
    result = CliRunner().invoke(main, ["doctor", "--from", str(root), "--json", "--html",
                                       str(tmp_path / "d.html")])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["verdict"] == "warn"
    assert (tmp_path / "d.html").read_text().startswith("<!DOCTYPE html>")


def test_html_path_checked_before_any_work(tmp_path):
    bad = str(tmp_path / "missing" / "page.html")
    for args in (["doctor", "--local", "--html", bad],
                 ["smoke", "--local", "2", "--html", bad],
                 ["train", "--local", "2", "--config", "tiny", "--html", bad, "--", "--steps", "1",
                  "--out", str(tmp_path / "run")],
                 ["topology", "--from", str(tmp_path), "--html", bad]):
        started = time.monotonic()
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, (args, result.output)
        assert "cannot write the HTML page to" in result.output and "does not exist" in result.output
        assert time.monotonic() - started < 5  # nothing probed, launched or trained
    assert not (tmp_path / "run").exists()


def test_train_page_needs_the_metrics_here(tmp_path, capsys):
    """The record is kept here; a run that logged nothing gets a warning, not a page."""
    from mlxcluster.cli.train import write_run_page

    write_run_page(tmp_path / "never-logged", str(tmp_path / "t.html"))
    err = capsys.readouterr().err
    assert "no HTML page written" in err and "logged no metrics" in err
    assert not (tmp_path / "t.html").exists()
    assert not (tmp_path / "t.html").exists()


def test_a_failed_run_says_so(tmp_path):
    run = write_run(tmp_path / "run", metrics_rows(steps=7, ranks=2))
    html = build_page(Report(runs=[run], failed_runs={str(run): "rank 1 exited with code 2"}))
    assert 'class="verdict fail"' in html and "training run: FAILED after 7 steps" in html
    assert "the run failed: rank 1 exited with code 2" in html


def test_restarts_and_dropped_hosts_are_listed_in_order(tmp_path):
    rows = metrics_rows(steps=20, ranks=3)
    events = [{"event": "start", "step": 0, "ranks": 3, "time": 1764000000.0},
              {"event": "restart", "restart": 1, "max_restarts": 2, "time": 1764000100.0,
               "cause": "a rank exited with code 255 (lost the ssh connection to mac3)"},
              {"event": "host_dropped", "host": "mac3", "reason": "unreachable over ssh",
               "ranks": 2, "grad_accum": 2, "time": 1764000105.0},
              {"event": "start", "step": 16, "ranks": 2, "time": 1764000110.0}]
    run = write_run(tmp_path / "run", [events[0], *rows[:16], *events[1:], *rows[16:]])
    html = build_page(Report(runs=[run]))
    said = [html.index(text) for text in (
        "launched on 3 rank(s), from the start",
        "restart 1/2 after: a rank exited with code 255 (lost the ssh connection to mac3)",
        "dropped mac3 (unreachable over ssh): going on with 2 rank(s), grad_accum 2",
        "launched on 2 rank(s), resuming at step 16")]
    assert said == sorted(said)
    plain = build_page(Report(runs=[write_run(tmp_path / "plain", [events[0], *rows])]))
    assert 'class="events"' not in plain  # one plain launch: nothing to list
    # a pipeline's host dropped: its stages re-split over the hosts left
    piped = {**events[2], "pipeline": 2}
    del piped["grad_accum"]
    html = build_page(Report(runs=[write_run(tmp_path / "pp", [events[0], *rows[:16], piped])]))
    assert "dropped mac3 (unreachable over ssh): going on with 2 rank(s), --pipeline 2" in html


def test_mfu_and_the_step_split_are_shown(tmp_path):
    rows = metrics_rows(steps=10, ranks=2)
    for i, r in enumerate(rows):
        if "loss" in r:
            r.update({"mfu": 0.30 + 0.01 * i, "compute_s": 0.020, "comm_s": 0.004,
                      "optimizer_s": 0.001})
    html = build_page(Report(runs=[write_run(tmp_path / "run", rows)]))
    assert "MFU (median of the logged steps) 3" in html
    assert "a logged step: compute 20.0 ms, comm 4.0 ms, optimizer 1.0 ms" in html
