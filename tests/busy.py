"""Run a command beside processes that keep the machine's cores busy for the whole run
(`make test-busy`): the suite must pass on a busy machine, with its waits tied to
progress (tests/waits.py). Prints the load it ran under and the command's seconds, and
exits with the command's code; the busy processes end with it, whatever happens.

    python -m tests.busy [--procs 2] -- COMMAND...
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

SPIN = "while True: pass"


def spinner_name(pid: int | None = None) -> str:
    """The word on the command line of the busy processes that process ``pid`` starts."""
    return f"mlxcluster-busy-{pid or os.getpid()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=2, help="busy processes (each takes a core)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    # Named by this process, so that what is left of them can be told from another run's.
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN, spinner_name()], stdin=subprocess.DEVNULL)
                for _ in range(args.procs)]
    started = time.monotonic()
    loads = []
    try:
        proc = subprocess.Popen(command)
        while proc.poll() is None:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                loads.append(os.getloadavg()[0])
        code = proc.returncode
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        code = proc.wait()
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    took = time.monotonic() - started
    shown = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "n/a"
    print(f"busy run: {' '.join(command)} beside {args.procs} busy process(es): exit {code} "
          f"after {took:.0f} s ({took / 60:.1f} min), load average {shown}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
