"""Which of mlx-lm's server lines serve's terminal shows.

Every line goes to the rank's log; the terminal is about the cluster. What
mlx-lm's server writes for one request is not shown whole there:

- its access line and its INFO lines (prompt cache, progress): not at all,
  or every probe would print ten lines;
- a request's traceback (``socketserver``'s "Exception occurred during
  processing of request" block: a client that closed its stream, a front
  that cut a hung request): one line, its last (the exception);
- its echo of a request it refused (``JSONDecodeError ... - Raw body:``,
  ``Invalid Request Body:``): one line without the body, which is the
  user's and may hold anything.

An example, as the ranks' lines come (rank 0's, prefixed ``[0] ``)::

    [0] 2026-11-29 01:45:06,207 - ERROR - JSONDecodeError: Expecting value: line 1 column 15 (char 14) - Raw body: {"messages": [oops
    [0] ----------------------------------------
    [0] Exception occurred during processing of request from ('127.0.0.1', 33116)
    [0] Traceback (most recent call last):
    [0]   File ".../socketserver.py", line 691, in process_request_thread
    ...
    [0] BrokenPipeError: [Errno 32] Broken pipe
    [0] ----------------------------------------

shown as::

    [0] mlx-lm refused a request: JSONDecodeError: Expecting value: line 1 column 15 (char 14) (the request is in the rank's log)
    [0] a request ended in mlx-lm's server with BrokenPipeError: [Errno 32] Broken pipe (the client went away; the traceback is in the rank's log)
"""

from __future__ import annotations

import re

RANK = re.compile(r"^(\[\d+\] )?")
# mlx-lm's server logs each request (its access line, its prompt cache, its
# prompt progress) at INFO.
QUIET = re.compile(r'"(GET|POST|OPTIONS|HEAD) \S+ HTTP/1\.[01]" \d{3}'
                   r"|^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ - (DEBUG|INFO) - ")
RULE = "-" * 40  # socketserver.BaseServer.handle_error's
REQUEST_FAILED = "Exception occurred during processing of request from"
TRACEBACK = "Traceback (most recent call last):"
ECHO = re.compile(r"^(?P<head>.* - ERROR - )(?:(?P<error>JSONDecodeError: .*?) - Raw body: .*"
                  r"|Invalid Request Body: .*)$")
CLIENT_GONE = ("BrokenPipeError", "ConnectionResetError", "ConnectionAbortedError")


class ServerLines:
    """Feed each rank line (``[R] `` prefixed or not) in order, with the
    stream it came on; ``shown`` returns the lines for the terminal (none,
    the line, or one line for a whole traceback)."""

    def __init__(self) -> None:
        self._in: dict[str, str] = {}  # rank prefix -> "rule", "request" or "traceback"
        self._last: dict[str, str] = {}  # rank prefix -> a request's traceback's last line

    def shown(self, line: str, stream: str = "") -> list[str]:
        text = line.rstrip("\n")
        rank = RANK.match(text).group(0)
        body = text[len(rank):]
        prefix = stream + rank  # each rank's stream is in order; they interleave
        state = self._in.get(prefix)
        if state == "rule":  # a rule alone, or the start of a request's traceback?
            if body.startswith(REQUEST_FAILED):
                self._in[prefix] = "request"
                return []
            del self._in[prefix]
            return [rank + RULE, *self.shown(line, stream)]
        if state in ("request", "traceback"):
            return self._inside(prefix, rank, body, state)
        if body == RULE:
            self._in[prefix] = "rule"
            return []
        if body == TRACEBACK:
            self._in[prefix] = "traceback"
            return []
        if QUIET.search(body):
            return []
        echo = ECHO.match(body)
        if echo:
            error = echo.group("error") or "Invalid Request Body"
            return [f"{rank}mlx-lm refused a request: {error} (the request is in the rank's log)"]
        return [text]

    def _inside(self, prefix: str, rank: str, body: str, state: str) -> list[str]:
        if state == "request":
            if body == RULE:  # the block's end: its last line said what failed
                del self._in[prefix]
                return [self._one_line(rank, self._last.pop(prefix, ""))]
            if body.strip() and body != TRACEBACK:
                self._last[prefix] = body.strip()
            return []
        if body.startswith((" ", "\t")) or not body.strip():  # the traceback's frames
            return []
        del self._in[prefix]  # a traceback outside a request ends at its exception line
        return [f"{rank}{body} (the traceback is in the rank's log)"]

    @staticmethod
    def _one_line(rank: str, exception: str) -> str:
        why = "the client went away; " if exception.startswith(CLIENT_GONE) else ""
        return (f"{rank}a request ended in mlx-lm's server with {exception or 'an error'} "
                f"({why}the traceback is in the rank's log)")
