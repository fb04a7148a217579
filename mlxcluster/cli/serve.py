"""`mlxcluster serve MODEL_DIR`: mlx-lm's own server on every host, one
address here, probed, restarted (docs/serve.md)."""

from __future__ import annotations

import os

import click

from mlxcluster.cli.job_launch import EventView, render_ending
from mlxcluster.cli.params import Duration, ProgramAfterDashDash, launch_flags, launch_options
from mlxcluster.errors import InputError
from mlxcluster.jobs.job import BACKENDS
from mlxcluster.jobs.restarts import Restarts
from mlxcluster.launch.job_source import one_source
from mlxcluster.launch.on_hosts import held_on_hosts
from mlxcluster.launch.session import launch_session
from mlxcluster.launch.supervisor import ending
from mlxcluster.serve.access import KEY_ENV, api_key_from
from mlxcluster.serve.serving import ServeSpec, model_named, serving_request, with_model_held
from mlxcluster.serve.session import FrontSpec, ServedModel, open_front


@click.command("serve", cls=ProgramAfterDashDash, program_param="server_args",
               program="mlx_lm.server",
               example="mlxcluster serve MODEL_DIR --port 9000 -- --max-tokens 2048")
@launch_options(BACKENDS)
@click.option("--pipeline", is_flag=True,
              help="Split the model's layers over the ranks (mlx-lm's pipeline) instead of each "
                   "layer's heads (tensor parallel, the default).")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True,
              help="The port of the one address here (http://127.0.0.1:PORT/v1).")
@click.option("--bind", default="127.0.0.1", show_default=True,
              help="Listen on this address instead (0.0.0.0: every interface; anyone who "
                   "reaches it can use the model).")
@click.option("--max-restarts", type=click.IntRange(0, 100), default=3, show_default=True,
              help="After a rank exits or a probe gets no answer: stop every rank, launch again, "
                   "up to this many times (then exit 4).")
@click.option("--probe-every", type=Duration(1), default="10s", show_default=True,
              help="How often a one-token completion checks that every rank answers.")
@click.option("--probe-timeout", type=Duration(1), default="30s", show_default=True,
              help="A probe without an answer this long is a hang (every rank stopped, launched "
                   "again). A long answer is not: it is waited for.")
@click.option("--request-timeout", type=Duration(1, words=("off",)), default="off",
              show_default=True,
              help="One request's limit: past it the client gets 504 (e.g. 10m; off: none).")
@click.option("--start-timeout", type=Duration(1), default="15m", show_default=True,
              help="The server must answer its first probe within this long of each launch "
                   "(loading the model).")
@click.option("--api-key-file", type=click.Path(dir_okay=False), default=None,
              help="Ask every client for the key on this file's first line (Authorization: "
                   "Bearer KEY, or x-api-key); also $MLXCLUSTER_API_KEY. /health stays open.")
@click.option("--api-key", default=None,
              help="The key itself (seen by other users in the process list: prefer "
                   "--api-key-file or $MLXCLUSTER_API_KEY).")
@click.option("--no-auth", is_flag=True,
              help="Serve on a --bind other machines reach without a key (refused otherwise).")
@click.option("--max-in-flight", type=click.IntRange(1, 256), default=None,
              help="Requests passed on to rank 0 at once (mlx-lm batches them). Default: 8 on "
                   "ring and MPI, where batched answers were measured equal to one at a time; 1 "
                   "on JACCL, where two at once kill both ranks (mlx-lm #1737), and NCCL.")
@click.option("--queue", type=click.IntRange(0, 10000), default=16, show_default=True,
              help="Requests that may wait for their turn, in order; one more gets 429 with "
                   "Retry-After at once.")
@click.option("--drain-timeout", type=Duration(0), default="30s", show_default=True,
              help="At Ctrl-C or SIGTERM: new requests get 503 and the ones admitted may "
                   "finish within this long; then every rank stops (a second Ctrl-C: at once).")
@click.option("--no-sync-model", is_flag=True,
              help="Do not check the model folder on every host (sha256) nor send it where it "
                   "is missing or different.")
@click.option("--download-on", "download_on", metavar="HOST",
              help="MODEL_DIR is a Hugging Face id that HOST downloads into its own cache; the "
                   "other hosts take it from HOST over the hosts' link, and this machine reads "
                   "only its config, tokenizer and weight headers (no copy here).")
@click.option("--logs", "logs_dir", type=click.Path(file_okay=False), default=None,
              help="Folder for one log file per rank and serve.log (default: ./runs/RUN_ID).")
@click.argument("model_dir", type=click.Path(file_okay=False))
def command(timeout, pipeline, port, bind, max_restarts, probe_every, probe_timeout,
            request_timeout, start_timeout, api_key_file, api_key, no_auth, max_in_flight,
            queue, drain_timeout, no_sync_model, download_on, logs_dir, model_dir, server_args,
            **launch):
    """Serve MODEL_DIR with mlx-lm's server split over every host, at one address here.

    e.g. `mlxcluster serve ~/models/Qwen3-4B-4bit -i cluster.yaml --port 9000`:
    serve's options go before or after MODEL_DIR. Arguments after `--` go to
    mlx_lm.server (not --model, --host, --port, --pipeline:
    serve sets those; its own options say where). Runs until Ctrl-C; every rank on every
    host is then stopped (exit 0), once the requests admitted are answered
    (--drain-timeout). Exit 2: bad input or a model that cannot
    be split so; 4: the restarts are spent (docs/serve.md).
    """
    flags = launch_flags(**launch)
    one_source("serve", flags.source, example="--local 2 MODEL_DIR")
    if timeout is not None:
        raise InputError("serve runs until it is stopped: --timeout does not apply",
                         "stop it with Ctrl-C or 'kill' (SIGTERM)")
    spec = ServeSpec(model_named(model_dir, download_on), pipeline,
                     probe_every, probe_timeout, start_timeout, server_args,
                     request_timeout=None if request_timeout == "off" else request_timeout,
                     drain_timeout=drain_timeout)
    key = api_key_from(api_key, api_key_file, dict(os.environ))
    ctx = click.get_current_context()
    front = ctx.with_resource(open_front(spec, FrontSpec(
        bind, port, key, no_auth, max_in_flight, queue)))  # first: a taken port said at once
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}  # the key stays here
    view = EventView("serve")
    held = ctx.with_resource(held_on_hosts(flags.source, model_dir, download_on, env,
                                           view)) if download_on else None
    spec, model_view = with_model_held(spec, held)
    request = serving_request(spec, flags, send_model=not no_sync_model, backend=front.backend,
                              view=model_view)
    prepared = ctx.with_resource(launch_session(request, env, view))
    served = ServedModel(spec, front, prepared, logs_dir)

    def show(stream: str, line: str) -> None:
        click.echo(line, err=stream == "stderr")

    try:
        done = served.serve(Restarts(max_restarts), env, on_line=show, on_event=view,
                            on_up=lambda text: click.secho(text, fg="green"))
    finally:
        served.close()
    render_ending(ending(done))
