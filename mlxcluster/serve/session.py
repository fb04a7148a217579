"""One `mlxcluster serve` here, around its launch session: what the CLI
used to assemble, built in serve/.

``open_front`` opens the one address first (a taken port is said before
anything is checked, sent or launched; a --bind others reach needs a key).
Once the launch session has prepared the job, ``ServedModel`` holds what
serving it keeps here: the ranks' logs and serve.log (``ServeJournal``),
the address and what is served ("NAME at ADDRESS (N ranks, SPLIT)") for
the status page and `mlxcluster jobs` (``announcing``), and the lines the
terminal shows of the ranks' (``ServerLines``); ``serve`` runs it
(serving.py ``serve_until_stopped``) to its end, a ``JobResult``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from mlxcluster.errors import InputError
from mlxcluster.jobs.events import Note, OnEvent
from mlxcluster.jobs.restarts import Restarts
from mlxcluster.jobs.run_output import open_rank_logs
from mlxcluster.launch.session import PreparedJob
from mlxcluster.launch.supervisor import JobResult
from mlxcluster.serve.access import check_exposure
from mlxcluster.serve.admission import Admission
from mlxcluster.serve.announce import announcing
from mlxcluster.serve.front import Backend, Front, served_counts
from mlxcluster.serve.journal import ServeJournal, up_line
from mlxcluster.serve.server_lines import ServerLines
from mlxcluster.serve.serving import ServeRun, ServeSpec, serve_until_stopped


@dataclass(frozen=True)
class FrontSpec:
    """Where the one address listens and who gets in (serve's flags)."""

    bind: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    no_auth: bool = False
    max_in_flight: int | None = None  # None: by the backend (admission.default_in_flight)
    queue: int = 16


def open_front(spec: ServeSpec, front: FrontSpec) -> Front:
    """The one address here, listening (close it when serve ends): InputError
    (exit 2) for a --bind other machines reach without a key, or a port
    taken."""
    check_exposure(front.bind, front.api_key, front.no_auth)
    backend = Backend(Admission(front.max_in_flight, front.queue))
    try:
        return Front(front.bind, front.port, backend, request_timeout=spec.request_timeout,
                     server_args=spec.server_args, api_key=front.api_key)
    except OSError as err:
        raise InputError(f"cannot listen on {front.bind}:{front.port}: {err.strerror}",
                         "give another --port (or stop what listens there)") from None


def address_of(front: Front) -> str:
    """The address clients are told: 0.0.0.0 listens everywhere, and is
    reached here at 127.0.0.1."""
    bind = front.bind
    return f"http://{'127.0.0.1' if bind == '0.0.0.0' else bind}:{front.port}/v1"


# huggingface_hub's cache: models--ORG--NAME/snapshots/COMMIT (an id holds no "--").
HUB_SNAPSHOT = re.compile(r"(?:^|/)models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/[^/]+$")


def served_name(folder: str) -> str:
    """What serve calls the model it serves: ORG/NAME for a snapshot in a
    Hugging Face cache (`serve ORG/NAME`, with or without --download-on: the
    folder's own name is a commit hash), else the folder's name."""
    folder = folder.rstrip("/")
    hub = HUB_SNAPSHOT.search(folder)
    return f"{hub['org']}/{hub['name']}" if hub else os.path.basename(folder)


class ServedModel:
    """What serving ``prepared`` keeps here: its logs (``logs_dir``, default
    ./runs/RUN_ID) and serve.log, its address, what the status page and
    `mlxcluster jobs` say of it. Close it when serve ends."""

    def __init__(self, spec: ServeSpec, front: Front, prepared: PreparedJob,
                 logs_dir: str | None):
        self.spec, self.front, self.prepared = spec, front, prepared
        self.logs_path, self.logs = open_rank_logs(logs_dir, prepared.run_id)
        self.address = address_of(front)
        name = served_name(spec.model)
        self.served = (f"{name} at {self.address} ({len(prepared.job.hosts)} ranks, "
                       f"{spec.split})")
        self.journal = ServeJournal(self.logs_path / "serve.log", self.served)
        front.backend.status.describe(model=name, split=spec.split, address=self.address,
                                      run_id=prepared.run_id, model_path=spec.model)

    @contextmanager
    def announced(self) -> Iterator[None]:
        """Within: the run's address and counts where `mlxcluster jobs` reads them."""
        backend = self.front.backend
        with announcing(self.prepared.run_id, self.address, lambda: served_counts(backend)):
            yield

    def serve(self, restarts: Restarts, env: dict[str, str], *,
              on_line: Callable[[str, str], None], on_event: OnEvent,
              on_up: Callable[[str], None]) -> JobResult:
        """Serve to the end (serving.py ``serve_until_stopped``): every rank's
        line kept in its log, those the terminal shows (``ServerLines``)
        to ``on_line``, each time the model is up said to ``on_up``."""
        terminal = ServerLines()

        def show(stream: str, line: str) -> None:
            self.logs.write(line)
            for shown in terminal.shown(line, stream):
                on_line(stream, shown)

        on_event(Note(f"logs: {self.logs_path}/rank<R>.log, {self.logs_path}/serve.log"))
        prepared = self.prepared
        with self.announced():
            return serve_until_stopped(
                ServeRun(prepared.job, self.spec, self.front.backend, prepared.run_id,
                         self.logs_path, self.journal), restarts, env,
                on_line=show, on_event=on_event,
                on_up=lambda up: on_up(up_line(self.served, up.launch, up.seconds)))

    def close(self) -> None:
        self.logs.close()
        self.journal.close()


