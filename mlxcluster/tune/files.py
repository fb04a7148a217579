"""The hostfile with the winning settings, and its launcher arguments.

Both backends get a pair, the convention of ``hostfile generate --backend mpi``:

* ring: ``OUT`` is the MLX JSON hostfile; ``OUT.args`` holds the launcher
  flag ``--connections-per-ip N`` (mlx.launch reads it only from its command
  line: ``mlx.launch --hostfile OUT $(cat OUT.args) --python P script.py``);
* mpi: ``OUT`` is the ``host slots=1`` file; ``OUT.args`` the mpirun
  arguments, ``--mca btl_tcp_links N`` among them, and for a forced allreduce
  ``--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4``
  (``mpirun --hostfile OUT -np N $(cat OUT.args) python script.py``).
"""

from __future__ import annotations

import shlex
from dataclasses import replace

from mlxcluster.facts.mpi import find_libmpi
from mlxcluster.hostfile.hostfile_generate import cluster_envs, generate_mlx_hostfile, generate_mpi
from mlxcluster.inventory.inventory import Inventory
from mlxcluster.tune.candidates import Candidate


def default_output(candidate: Candidate) -> str:
    """hostfile-ring.json or hostfile-mpi.txt, as ``hostfile generate`` names them."""
    return "hostfile-mpi.txt" if candidate.backend == "mpi" else f"hostfile-{candidate.backend}.json"


def restricted(inventory: Inventory, candidate: Candidate) -> Inventory:
    """The inventory with every host on the candidate's data IP only."""
    if candidate.ip_index is None:
        return inventory
    return replace(inventory, hosts=tuple(replace(h, ips=(h.ips[candidate.ip_index],))
                                          for h in inventory.hosts))


def launcher_args(candidate: Candidate) -> tuple[str, ...]:
    """The ring launcher flag of the winner (mlx.launch's default is 1)."""
    return ("--connections-per-ip", str(candidate.connections))


def winner_files(inventory: Inventory, candidate: Candidate, output: str) -> dict[str, str]:
    """{path: text} for the hostfile and its ``.args`` beside it."""
    inv = restricted(inventory, candidate)
    envs = cluster_envs(inv)
    if candidate.backend == "mpi":
        files = generate_mpi(inv, envs, tcp_links=candidate.tcp_links,
                             libmpi=find_libmpi(python=inv.python),
                             extra_args=candidate.allreduce_args())
        return {output: files.hostfile, output + ".args": files.args_line()}
    hostfile = generate_mlx_hostfile(inv, candidate.backend, envs=envs)
    return {output: hostfile.dumps(), output + ".args": shlex.join(launcher_args(candidate)) + "\n"}


def usage(candidate: Candidate, output: str, python: str) -> str:
    """The command line that runs a script with the written settings."""
    q = shlex.quote
    if candidate.backend == "mpi":
        return f"mpirun --hostfile {q(output)} -np N $(cat {q(output + '.args')}) {q(python)} script.py"
    return (f"mlx.launch --hostfile {q(output)} $(cat {q(output + '.args')}) "
            f"--python {q(python)} script.py")
