"""Which launchers' command lines a login shell parses.

sshd runs every remote command with the user's login shell, so the shell
parses what the launchers send: mlx.launch (ring, jaccl, nccl) bash text
(`cmd=(...)`, `[[ -d ... ]]`), mpirun and mlxcluster's own chores POSIX sh.
Measured in the lab (docs/doctor-checks.md, login-shell): under fish mlx.launch
and mpirun hang, rank 0 waiting for a rank that never started; under dash
mlx.launch's rank there exits 2 and mpirun runs.
"""

from __future__ import annotations

from pathlib import PurePosixPath

BASH_LIKE = frozenset({"bash", "zsh", "ksh", "ksh93"})
POSIX_ONLY = frozenset({"dash", "ash", "posh", "busybox"})
NOT_POSIX = frozenset({"fish", "csh", "tcsh", "nu", "xonsh", "elvish", "pwsh", "rc", "es"})
SHELL_FIX = "chsh -s /bin/zsh (macOS) or chsh -s /bin/bash (Linux)"


def shell_kind(path: str | None, resolved: str | None, platform: str | None) -> str | None:
    """"bash" (runs mlx.launch's command), "posix" (mpirun's only), "other"
    (neither), "unknown", or None when the probe did not say. macOS's /bin/sh
    is bash in POSIX mode, which takes mlx.launch's arrays; Linux's is
    whatever it links to (dash on Debian and Ubuntu)."""
    if not path:
        return None
    name = PurePosixPath(resolved or path).name
    if name == "sh":
        return "bash" if platform == "darwin" else "posix"
    if name in BASH_LIKE:
        return "bash"
    if name in POSIX_ONLY:
        return "posix"
    return "other" if name in NOT_POSIX else "unknown"


def parses_launch(kind: str | None, backend: str | None) -> bool | None:
    """Whether a login shell of ``kind`` parses the command line that starts a
    rank of ``backend`` over ssh (mpi: mpirun's; the others: mlx.launch's);
    None when it is not known (an unknown shell, or a POSIX sh and no backend)."""
    if kind in (None, "unknown"):
        return None
    if kind == "other":
        return False
    if kind == "posix":
        return None if backend in (None, "any") else backend == "mpi"
    return True


def launch_refusal(shell: str | None, kind: str | None, backend: str | None) -> str | None:
    """Why a host whose login shell ``shell`` is of ``kind`` cannot start a rank
    of ``backend`` over ssh, with the fix, in the words run, train and smoke
    say it; None when it can, or when that is not known."""
    if parses_launch(kind, backend) is not False:
        return None
    launcher = "mpirun" if backend == "mpi" else "mlx.launch"
    return (f"its login shell {shell} cannot parse the command line {launcher} sends over ssh "
            f"(the launch would hang, or that rank exit 2): {SHELL_FIX} there")
