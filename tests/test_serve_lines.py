"""What serve's terminal shows of mlx-lm's server lines (serve/server_lines.py),
on real captured output (tests/fixtures/serve_output/README.md)."""

from __future__ import annotations

from pathlib import Path

from mlxcluster.serve.server_lines import ServerLines

CAPTURED = Path(__file__).parent / "fixtures" / "serve_output" / "mlx_lm_request_errors.txt"


def shown(lines: list[str], stream: str = "stderr") -> list[str]:
    terminal = ServerLines()
    return [out for line in lines for out in terminal.shown(line, stream)]


def test_a_request_s_traceback_is_one_line_and_its_body_is_not_echoed():
    lines = CAPTURED.read_text().splitlines()
    assert sum(line.endswith("Traceback (most recent call last):") for line in lines) == 2
    broken_pipe = ("[0] a request ended in mlx-lm's server with BrokenPipeError: [Errno 32] Broken "
                   "pipe (the client went away; the traceback is in the rank's log)")
    out = shown(lines)
    assert out == [
        lines[0], lines[1],  # mlx-lm's warning at start, kept
        "[0] mlx-lm refused a request: JSONDecodeError: Expecting value: line 1 column 15 "
        "(char 14) (the request is in the rank's log)",
        broken_pipe,  # a non-streamed answer whose client had gone
        broken_pipe,  # a stream the client closed
    ]
    assert not any("Raw body" in line or "oops" in line or "File " in line for line in out)


def test_access_and_info_lines_are_quiet_and_other_lines_are_shown_as_they_are():
    assert shown(['[0] 127.0.0.1 - - [29/Nov/2026 01:45:06] "POST /v1/completions HTTP/1.1" 200 -',
                  "[1] 2026-11-29 01:45:06,207 - INFO - Prompt Cache: 1 sequences, 0.00 GB",
                  "[0] 2026-11-29 01:45:06,207 - WARNING - the cache is full",
                  "a line of a rank with no prefix"]) == [
        "[0] 2026-11-29 01:45:06,207 - WARNING - the cache is full",
        "a line of a rank with no prefix"]


def test_a_rule_alone_is_kept_and_a_traceback_outside_a_request_ends_at_its_exception():
    rule = "-" * 40
    assert shown([f"[0] {rule}", "[0] between rules", f"[0] {rule}", "[0] after"]) == [
        f"[0] {rule}", "[0] between rules", f"[0] {rule}", "[0] after"]
    assert shown(["[1] 2026-11-29 01:45:06,207 - ERROR - mlx_lm.server generation thread died: x",
                  "[1] Traceback (most recent call last):",
                  '[1]   File "server.py", line 540, in _generate',
                  "[1]     raise RuntimeError('x')",
                  "[1] RuntimeError: x",
                  "[1] next"]) == [
        "[1] 2026-11-29 01:45:06,207 - ERROR - mlx_lm.server generation thread died: x",
        "[1] RuntimeError: x (the traceback is in the rank's log)",
        "[1] next"]


def test_ranks_and_streams_interleaving_do_not_mix_their_blocks():
    rule = "-" * 40
    terminal = ServerLines()
    out = []
    for stream, line in [("stderr", f"[0] {rule}"),
                         ("stdout", "[1] rank 1 says hello"),
                         ("stderr", "[0] Exception occurred during processing of request from x"),
                         ("stderr", "[1] a line of rank 1"),
                         ("stderr", "[0] ConnectionResetError: [Errno 104] reset"),
                         ("stderr", f"[0] {rule}")]:
        out += terminal.shown(line, stream)
    assert out == ["[1] rank 1 says hello", "[1] a line of rank 1",
                   "[0] a request ended in mlx-lm's server with ConnectionResetError: [Errno 104] "
                   "reset (the client went away; the traceback is in the rank's log)"]
