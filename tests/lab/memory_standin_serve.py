"""`mlxcluster ARGS` with each host's memory facts stood in for, as the macOS
tests stand in for what Linux lab hosts cannot show: serve's split check
(serve/serving.py ``probe_facts``) probes every host for real, then each host
named in $STANDIN_MEMORY_GB (``labhost1=16,labhost2=32``) is judged as a Mac
of that RAM whose GPU may wire 2/3 of it (macOS's default share; mlx's working
set). Everything else (the launch, the sending, the ranks) is the real thing.

    STANDIN_MEMORY_GB=labhost1=16,labhost2=32 python -m tests.lab.memory_standin_serve serve ...
"""

from __future__ import annotations

import dataclasses
import os
import sys

GIB = 2**30


def stood_in(facts: dict, memory_gb: dict[str, float]) -> dict:
    out = dict(facts)
    for host, gb in memory_gb.items():
        if out.get(host) is not None:
            ram = int(gb * GIB)
            out[host] = dataclasses.replace(out[host], platform="darwin", memory_bytes=ram,
                                            gpu_wired_limit_mb=0, gpu_working_set_bytes=ram * 2 // 3)
    return out


def standin_memory(text: str) -> dict[str, float]:
    return {host: float(gb) for host, gb in (part.split("=") for part in text.split(",") if part)}


def install(memory_gb: dict[str, float]) -> None:
    from mlxcluster.serve import serving

    probe = serving.probe_facts
    serving.probe_facts = lambda job, env=None, **kw: stood_in(probe(job, env, **kw), memory_gb)


if __name__ == "__main__":
    install(standin_memory(os.environ.get("STANDIN_MEMORY_GB", "")))
    from mlxcluster.cli import run

    sys.argv = ["mlxcluster", *sys.argv[1:]]
    run()
