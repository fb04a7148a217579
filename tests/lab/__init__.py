"""A real multi-host cluster on one Linux machine, for tests and benchmarks.

Each host is a network namespace on a private bridge, with its own IP and
its own hostname (UTS namespace) and its own disk at ``lab.disk`` (a mount
namespace), running a real OpenSSH ``sshd`` that runs every command through
zsh, a Mac's login shell (``LOGIN_SHELL``). Clients
reach the hosts through an ``ssh`` wrapper first on PATH that points OpenSSH
at the lab's own ssh_config (``~/.ssh`` is never touched), so ``mlx.launch``,
``mpirun``, paramiko and mlxcluster all talk to real servers with no prompt.

Follows docs/lab.md. Rules kept here:
- only addresses of hosts the lab made are ever contacted (a private /24 that
  no interface of this machine uses yet);
- everything made (namespaces, links, processes, temp files) is removed on
  teardown, also after a failure or Ctrl-C, and a start cleans stale leftovers
  of crashed runs (labs whose owning process is gone);
- every wait is bounded.

Usage::

    with start_lab(3) as lab:
        lab.ssh(lab.hosts[0], "hostname")
        lab.drop_port(lab.hosts[1], "32323-32400")
        lab.add_second_link()          # every host gets eth1 on a second bridge
        lab.slow_link(0, "50mbit", dev="eth1")
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import pwd
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

RANK_STACKS = "/tmp/mlxcluster-stacks"  # as mlxcluster.jobs.rank_wrapper.STACKS_ROOT

STATE_ROOT = Path("/tmp")
STATE_PREFIX = "mlxcluster-lab-"
NAME_PREFIX = "mlxc"  # namespaces, bridge and veths all start with this
SSHD = "/usr/sbin/sshd"
# Every host's sshd listens on 22 and on this port too, so that a test can
# firewall 22 and reach the host only on another port, as a Mac whose
# inventory says ``port:`` (its known_hosts line is ``[ip]:port``).
SECOND_SSH_PORT = 2222
# MLX's compiled CPU kernels, one folder for this machine and every lab host
# (see Lab.share_kernels); MLXCLUSTER_LAB_OWN_KERNELS=1 gives each host its own
# again, as before (bench/lab_kernels.py measures the two).
KERNEL_CACHE = Path(tempfile.gettempdir()) / "mlx"
OWN_KERNELS_ENV = "MLXCLUSTER_LAB_OWN_KERNELS"
KERNEL_CC = Path(__file__).resolve().parents[1] / "kernel_cc"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CMD_TIMEOUT = 20.0
REQUIRED_TOOLS = ("ip", "unshare", "nsenter", "findmnt", "nft", "tc", "ssh", "ssh-keygen", "ssh-keyscan", "zsh")
# sshd runs every command through the user's login shell: zsh on a Mac since
# Catalina. zsh differs where scripts break (a glob that matches nothing
# fails and drops the rest of the line; unquoted $vars are not split), so
# the hosts' root has it too (_login_shell_mount).
LOGIN_SHELL = "zsh"


class LabError(RuntimeError):
    """The lab could not be built or a lab operation failed."""


def lab_unavailable_reason() -> str | None:
    """Why the lab cannot run on this machine, or None when it can."""
    if sys.platform != "linux":
        return f"the lab needs Linux network namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return "the lab needs root (network namespaces, sshd)"
    if not Path(SSHD).exists():
        return "sshd is missing: apt-get install openssh-server (make test does this)"
    missing = [t for t in REQUIRED_TOOLS if shutil.which(t, path=SYSTEM_PATH) is None]
    if missing:
        return (f"missing tools: {', '.join(missing)} (make test installs iproute2, nftables, "
                "openssh, zsh)")
    return None


def _run(args: list[str], *, timeout: float = CMD_TIMEOUT, check: bool = True,
         input: str | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, input=input)
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


@dataclass
class LabHost:
    index: int
    name: str  # hostname inside the host, e.g. labhost1
    ip: str
    netns: str
    veth: str
    sshd: subprocess.Popen | None = None
    path: str = ""  # PATH a non-interactive ssh session gets on this host
    python: str | None = None  # per-host python override (see Lab.python)
    faults: set[str] = field(default_factory=set)
    second_ip: str | None = None  # on eth1, once Lab.add_second_link ran
    login_shell: str = LOGIN_SHELL  # what sshd runs commands through (set_login_shell)
    small_disks: list[str] = field(default_factory=list)  # tmpfs mount points (small_disk)

    def __str__(self) -> str:
        return self.name


# Shell lines that keep every argument of "$@" but -F FILE / -FFILE: an ssh
# on a host must not be given the lab's config (and with it the lab's key).
DROP_CONFIG_ARGS = (
    '    skip=\n'
    '    for a in "$@"; do\n'
    '      shift\n'
    '      if [ -n "$skip" ]; then skip=; continue; fi\n'
    '      case "$a" in -F) skip=1; continue ;; -F*) continue ;; esac\n'
    '      set -- "$@" "$a"\n'
    '    done\n'
)


class Lab:
    """A running lab; build it with ``start_lab``."""

    def __init__(self, n: int, *, python: str | None = None, own_tmp: bool = False,
                 no_project: bool = False, own_ssh: bool = False):
        if n < 1 or n > 60:
            raise LabError("a lab has 1 to 60 hosts")
        self.own_tmp = own_tmp  # every host's /tmp its own too (see _own_tmp_mount)
        # own_ssh: every host's ~/.ssh its own (in its own home, so no_project too); see _login_shell_mount.
        self.own_ssh = own_ssh
        self.no_project = no_project or own_ssh  # no copy of this project, a home of its own (_no_project_mount)
        self.id = secrets.token_hex(2)
        self.tag = f"{NAME_PREFIX}{self.id}"
        self.state = STATE_ROOT / f"{STATE_PREFIX}{self.id}"
        self.bin_dir = self.state / "bin"
        self.key = self.state / "id_ed25519"
        self.host_key = self.state / "ssh_host_ed25519_key"
        self.known_hosts = self.state / "known_hosts"
        self.ssh_config = self.state / "ssh_config"
        # deny_host_to_host: a key no host authorizes, its config, and the log of attempts.
        self.untrusted_key = self.state / "id_untrusted"
        self.untrusted_config = self.state / "ssh_config_untrusted"
        self.host_to_host_log = self.state / "host_to_host.log"
        self.bridge = f"{self.tag}br"
        self.subnet = _free_subnet(self.id)
        net = ipaddress.ip_network(self.subnet)
        self.gateway = str(net.network_address + 1)
        self.default_python = python or sys.executable
        # Non-interactive sessions find the venv's tools (mpirun...) and the wrapper.
        self.default_path = f"{self.bin_dir}:{Path(self.default_python).parent}:{SYSTEM_PATH}"
        self.hosts = [
            LabHost(
                index=i,
                name=f"labhost{i + 1}",
                ip=str(net.network_address + 11 + i),
                netns=f"{self.tag}h{i + 1}",
                veth=f"{self.tag}v{i + 1}",
                path=self.default_path,
            )
            for i in range(n)
        ]

    # ---- addresses and environment -------------------------------------------------
    @property
    def python(self) -> str:
        """The python path to put in inventories: a dispatcher that runs the
        default python, or a host's override (``set_host_python``)."""
        return str(self.bin_dir / "python")

    # Every host has its own TMPDIR, as every Mac has its own /tmp (and TMPDIR):
    # Open MPI / PMIx keep session files and rendezvous sockets there named by
    # host and pid. With one shared /tmp, the stale socket of a SIGKILLed
    # daemon can make a later one that reuses its pid fail (PMIx's "listener
    # thread failed to start", once in CI). All of it goes with the lab.
    @property
    def client_tmp(self) -> Path:
        return self.state / "tc"

    def host_tmp(self, h: LabHost) -> Path:
        return self.state / f"t{h.index + 1}"

    # ...but not MLX's compiled CPU kernels. MLX keeps them in $TMPDIR/mlx/<version>/cpu
    # and builds each with `g++ -O3` the first time a process meets it; with a TMPDIR of
    # its own, every host of every lab compiled the same few hundred kernels again (507
    # in the four labs of one suite run, issue 50), which is not what any test is about.
    # So each lab TMPDIR's `mlx` is a link to one folder, this machine's own (what the
    # product writes stays on each host's disk). MLX builds a kernel under a temporary
    # name and renames it into place, so hosts compiling at once never load half a file;
    # the version in the path keeps a host on another mlx (mlx_overlay) apart. The ranks
    # of a job meet each kernel at the same moment, so the hosts' PATH also has
    # tests/kernel_cc/g++, which builds each source once and copies it to the others.
    @property
    def shares_kernels(self) -> bool:
        return os.environ.get(OWN_KERNELS_ENV, "") not in ("1", "true")

    # Every host has its own disk, as every Mac has: ``lab.disk`` is one path
    # that each host sees as its own directory (a bind mount in the host's
    # mount namespace), while this machine, where mlxcluster runs, sees a
    # directory of its own there. A file a rank writes under it on labhost2
    # is not on labhost1 nor here. Put runs' --out, logs, stall folders and
    # data under it; read a host's files with ``host_read`` / ``host_exists``.
    @property
    def disk(self) -> Path:
        return self.state / "disk"

    def host_disk(self, h: LabHost) -> Path:
        """Where host ``h``'s own disk lies on this machine (seen as ``lab.disk`` there)."""
        return self.state / f"disk{h.index + 1}"

    # With ``no_project`` every host has its own HOME, at one path (``home``)
    # as on Macs with the same user name, bound like ``disk``.
    @property
    def home(self) -> Path:
        return self.state / "home"

    def host_home(self, h: LabHost) -> Path:
        """Where host ``h``'s own HOME lies on this machine (seen as ``home`` there)."""
        return self.state / f"home{h.index + 1}"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """os.environ with the lab's ssh wrapper first on PATH, then the venv's
        bin (as in an activated venv: mlx.launch looks up mpirun on PATH), and
        the lab's own client TMPDIR."""
        env = dict(os.environ if base is None else base)
        venv_bin = Path(self.default_python).parent
        env["PATH"] = f"{self.bin_dir}:{venv_bin}:{env.get('PATH', SYSTEM_PATH)}"
        env["TMPDIR"] = str(self.client_tmp)
        return env

    def host(self, ref: LabHost | str | int) -> LabHost:
        if isinstance(ref, LabHost):
            return ref
        if isinstance(ref, int):
            return self.hosts[ref]
        for h in self.hosts:
            if ref in (h.name, h.ip):
                return h
        raise LabError(f"no lab host {ref!r}")

    def write_inventory(self, path: str | Path, *, python: str | None = None,
                        hosts: list[LabHost] | None = None, use_names: bool = False,
                        data_ips: dict[str, list[str]] | None = None,
                        env: dict[str, str] | None = None) -> Path:
        """Write an mlxcluster inventory for the lab (ssh by IP, or by Host alias);
        ``data_ips``: host name -> its ``ips`` (default: the host's one IP);
        ``env``: the cluster's ``env:`` block (what every rank gets)."""
        lines = [
            f"cluster: lab{self.id}",
            "user: root",
            f"python: {python or self.python}",
            f"ssh_config: {self.ssh_config}",
            "hosts:",
        ]
        for h in hosts or self.hosts:
            target = h.name if use_names else h.ip
            ips = ", ".join(data_ips[h.name] if data_ips else [h.ip])
            lines += [f"  - name: {h.name}", f"    ssh: {target}", f"    ips: [{ips}]"]
        if env:
            lines += ["env:", *(f"  {name}: {value}" for name, value in env.items())]
        p = Path(path)
        p.write_text("\n".join(lines) + "\n")
        return p

    # ---- running commands ----------------------------------------------------------
    def ssh(self, host: LabHost | str | int, command: str, *, timeout: float = CMD_TIMEOUT,
            check: bool = False) -> subprocess.CompletedProcess:
        """Run a shell command on a host through real OpenSSH (BatchMode)."""
        h = self.host(host)
        return _run(["ssh", "-F", str(self.ssh_config), h.ip, command],
                    timeout=timeout, check=check)

    def host_exists(self, host: LabHost | str | int, path: str | Path) -> bool:
        """Whether ``path`` exists on the host's own disk, asked over ssh."""
        return self.ssh(host, f"test -e {shlex.quote(str(path))}").returncode == 0

    def host_read(self, host: LabHost | str | int, path: str | Path) -> str:
        """A text file as the host sees it (LabError when it cannot be read there)."""
        proc = self.ssh(host, f"cat {shlex.quote(str(path))}")
        if proc.returncode != 0:
            raise LabError(f"{self.host(host).name}: cannot read {path}: {proc.stderr.strip()}")
        return proc.stdout

    def netns_exec(self, host: LabHost | str | int, args: list[str], *,
                   timeout: float = CMD_TIMEOUT, check: bool = True) -> subprocess.CompletedProcess:
        """Run a command inside a host's namespace directly (no ssh)."""
        h = self.host(host)
        return _run(["ip", "netns", "exec", h.netns, *args], timeout=timeout, check=check)

    # ---- faults ----------------------------------------------------------------------
    def link_down(self, host) -> None:
        """Cut the host's cable: connects to it time out."""
        h = self.host(host)
        self.netns_exec(h, ["ip", "link", "set", "eth0", "down"])
        h.faults.add("link_down")

    def stop_sshd(self, host) -> None:
        """Stop the host's sshd: connects are refused."""
        h = self.host(host)
        _stop_process(h.sshd)
        h.sshd = None
        h.faults.add("sshd_stopped")

    def drop_port(self, host, ports: str | int) -> None:
        """Firewall: silently drop inbound TCP to a port or range ('32323-32400')."""
        h = self.host(host)
        ports = str(ports)
        if not all(part.isdigit() for part in ports.split("-", 1)):
            raise LabError(f"bad port spec {ports!r}")
        rules = (
            "table inet mlxclab {\n"
            "  chain input { type filter hook input priority 0; policy accept;\n"
            f"    tcp dport {ports} drop\n"
            "  }\n}\n"
        )
        _run(["ip", "netns", "exec", h.netns, "nft", "-f", "-"], input=rules)
        h.faults.add("port_dropped")

    def slow_link(self, host, rate: str = "100mbit", dev: str = "eth0") -> None:
        """Throttle the host's egress on ``dev`` (eth0; eth1 after add_second_link)
        with a token bucket (netem is not in this kernel)."""
        h = self.host(host)
        self.netns_exec(h, ["tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                            "rate", rate, "burst", "32kbit", "latency", "400ms"])
        h.faults.add("slow_link")

    def small_disk(self, host, path: str | Path, size: str) -> None:
        """Give the host a small disk of its own at ``path`` (a folder under
        ``lab.disk``): a tmpfs of ``size`` bytes ("128k", "1m") mounted in the
        host's mount namespace, so only that host sees it and a write there
        that needs more fails with ENOSPC, as on a full disk. The folder is
        made on the host's own disk if missing. ``heal`` unmounts it (its
        files go with it)."""
        h = self.host(host)
        path = str(path)
        _run(["nsenter", "-t", str(h.sshd.pid), "-m", "sh", "-c",
              f"mkdir -p {shlex.quote(path)} && mount -t tmpfs -o size={shlex.quote(size)} "
              f"{self.tag}small {shlex.quote(path)}"])
        h.small_disks.append(path)
        h.faults.add("small_disk")

    def resize_small_disk(self, host, path: str | Path, size: str) -> None:
        """Make a ``small_disk`` larger (room freed) or smaller, its files kept."""
        h = self.host(host)
        _run(["nsenter", "-t", str(h.sshd.pid), "-m", "mount", "-o", f"remount,size={size}",
              str(path)])

    def set_host_path(self, host, path: str) -> None:
        """Give non-interactive ssh sessions on this host another PATH (sshd restarted)."""
        h = self.host(host)
        h.path = path
        self._restart_sshd(h)
        h.faults.add("path")

    def set_login_shell(self, host, shell: str) -> None:
        """Give root another login shell on this host (``fish``, ``tcsh``...;
        sshd restarted): every command sent over ssh is then parsed by it."""
        h = self.host(host)
        if shutil.which(shell, path=SYSTEM_PATH) is None:
            raise LabError(f"{shell} is not installed here (apt-get install {shell})")
        h.login_shell = shell
        self._restart_sshd(h)
        h.faults.add("login_shell")

    def set_host_python(self, host, python: str) -> None:
        """Make the lab python path run another interpreter on this host only."""
        h = self.host(host)
        h.python = python
        self._write_python_dispatch()
        h.faults.add("python")

    def forget_host_key(self, host) -> None:
        """Remove the host from known_hosts: its key becomes unknown to clients."""
        h = self.host(host)
        self._write_known_hosts(exclude={h.ip, h.name})
        h.faults.add("host_key")

    def deny_host_to_host(self, hosts=None) -> Path:
        """Take away host-to-host SSH trust from ``hosts`` (default: all).

        The hosts share this machine's filesystem and root home, so any ssh a
        host runs (the lab wrapper on PATH, or a wrapper of mlx.launch/mpirun
        by absolute path, even one passing ``-F <lab config>``) would use the
        lab key. The wrapper now looks at the hostname it runs under: on a
        denied host it drops every ``-F`` and uses a config whose key no host
        authorizes, so ssh fails with "Permission denied (publickey)", as on
        Macs where only this machine's key was copied to the others. This
        machine keeps its access. Each attempt from a denied host is appended
        to the returned log as "FROM ARGS..."; ``heal`` restores trust.
        """
        for h in [self.host(r) for r in hosts] if hosts is not None else self.hosts:
            h.faults.add("no_host_to_host")
        if not self.untrusted_key.exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"mlxcluster-lab-{self.id}-untrusted",
                  "-f", str(self.untrusted_key)])
        config = self.ssh_config.read_text().replace(f"IdentityFile {self.key}\n",
                                                     f"IdentityFile {self.untrusted_key}\n")
        self.untrusted_config.write_text(config)
        self.host_to_host_log.touch()
        self._write_ssh_wrapper()
        return self.host_to_host_log

    def host_to_host_attempts(self) -> list[tuple[str, list[str]]]:
        """(from host, ssh arguments) of each ssh a denied host tried."""
        if not self.host_to_host_log.exists():
            return []
        rows = []
        for line in self.host_to_host_log.read_text().splitlines():
            if line.strip():
                source, *args = line.split()
                rows.append((source, args))
        return rows

    def heal(self, host=None) -> None:
        """Undo every fault on one host (or all hosts)."""
        for h in [self.host(host)] if host is not None else self.hosts:
            if not h.faults:
                continue
            while h.small_disks and h.sshd is not None:  # its mount namespace is sshd's
                _run(["nsenter", "-t", str(h.sshd.pid), "-m", "umount", h.small_disks.pop()])
            h.small_disks.clear()
            self.netns_exec(h, ["ip", "link", "set", "eth0", "up"])
            self.netns_exec(h, ["nft", "flush", "ruleset"], check=False)
            for dev in ("eth0", "eth1") if h.second_ip else ("eth0",):
                self.netns_exec(h, ["tc", "qdisc", "del", "dev", dev, "root"], check=False)
            h.python = None
            restart = (h.sshd is None or h.path != self.default_path
                       or h.login_shell != LOGIN_SHELL)
            h.path, h.login_shell = self.default_path, LOGIN_SHELL
            if restart:
                self._restart_sshd(h)
            h.faults.clear()
        self._write_python_dispatch()
        self._write_ssh_wrapper()
        self._write_known_hosts()
        for h in [self.host(host)] if host is not None else self.hosts:
            self._wait_ssh(h)

    # ---- a shared lab stays as it was --------------------------------------------------
    # What a test could change on a host and forget to put back, read from
    # inside the host's own namespaces (nsenter into its sshd: no ssh login,
    # ~10 ms a host): links and addresses, firewall, qdiscs, mounts (an
    # overlay over site-packages, a tmpfs over ~/.cache) and the processes
    # running there besides sshd itself.
    # Each aspect: a command run inside the host, its output compared line by
    # line. IPv4 only (an IPv6 link-local address is "tentative" for a moment);
    # /run/netns holds every lab's namespaces, other test workers' too.
    _HOST_STATE = {
        "links": "ip -o link show | sed 's/^[0-9]*: //'",
        "addresses": "ip -o -4 addr show",
        "firewall": "nft list ruleset",
        "qdiscs": "tc qdisc show",
        "mounts": "findmnt -rn -o TARGET,FSTYPE | grep -v '^/run/netns' | sort",
    }

    def fingerprint(self) -> dict[str, object]:
        """The lab's state that a test must leave as it found it, one entry
        an aspect: the lab-side files clients read, and for each host its
        faults and settings, what each ``_HOST_STATE`` command shows inside
        it, and the processes running there."""
        state: dict[str, object] = {
            name: (self.state / name).read_bytes() if (self.state / name).exists() else None
            for name in ("known_hosts", "ssh_config", "authorized_keys", "bin/ssh", "bin/python")}
        script = "".join(f"echo '@@ {aspect}'; {command}; " for aspect, command in self._HOST_STATE.items())
        for h in self.hosts:
            alive = h.sshd is not None and h.sshd.poll() is None
            state.update({f"{h.name} faults": sorted(h.faults), f"{h.name} sshd": alive,
                          f"{h.name} path": h.path, f"{h.name} python": h.python,
                          f"{h.name} login shell": h.login_shell,
                          f"{h.name} processes": self.host_processes(h)})
            if not alive:
                continue
            shown = _run(["nsenter", "-t", str(h.sshd.pid), "-m", "-n", "-u", "sh", "-c", script],
                         check=False).stdout
            for part in shown.split("@@ ")[1:]:
                aspect, _, lines = part.partition("\n")
                state[f"{h.name} {aspect}"] = lines.splitlines()
        return state

    def host_processes(self, host) -> list[str]:
        """Command lines of what runs in the host's namespace, sshd's listener
        aside (a session that is still closing counts: callers poll)."""
        h = self.host(host)
        pids = _run(["ip", "netns", "pids", h.netns], check=False).stdout.split()
        found = []
        for pid in pids:
            if h.sshd is not None and int(pid) == h.sshd.pid:
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:  # gone meanwhile
                continue
            if cmdline:
                found.append(cmdline)
        return sorted(found)

    def end_orphaned_sessions(self, host) -> list[str]:
        """End the host's sshd sessions whose command has ended but whose
        client went with a cut link: sshd keeps each until TCP gives up on
        the lost peer (its next retransmission after the link is back, up to
        a minute or more), which is sshd's, not what a test is about. A
        session still running a command has a child and is left alone.
        Returns the command lines ended."""
        h = self.host(host)
        ended = []
        for pid in _run(["ip", "netns", "pids", h.netns], check=False).stdout.split():
            if h.sshd is not None and int(pid) == h.sshd.pid:
                continue
            try:
                proc = psutil.Process(int(pid))
                if proc.cmdline()[:1] and proc.cmdline()[0].startswith("sshd: ") and not proc.children():
                    ended.append(" ".join(proc.cmdline()))
                    proc.kill()
            except psutil.Error:  # gone meanwhile
                continue
        return ended

    def kill_host_processes(self) -> None:
        """Kill everything running on the hosts but their sshd listeners."""
        for h in self.hosts:
            for pid in _run(["ip", "netns", "pids", h.netns], check=False).stdout.split():
                if h.sshd is None or int(pid) != h.sshd.pid:
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)

    # ---- a second network -------------------------------------------------------------
    def add_second_link(self) -> dict[str, str]:
        """Give every host a second interface, ``eth1``, on a second bridge
        with its own free /24 (as a Mac with Thunderbolt beside Ethernet):
        real veths in the namespaces. Returns host name -> its second IP.
        Removed with the lab: the bridge and the veths are named by the lab's
        tag (``_destroy``), and eth1 goes with its namespace."""
        if any(h.second_ip for h in self.hosts):
            raise LabError("the hosts already have a second link")
        subnet = ipaddress.ip_network(_free_subnet(self.id))
        bridge = f"{self.tag}b2"
        _run(["ip", "link", "add", bridge, "type", "bridge"])
        # This machine gets an address there too, as on the first bridge: the
        # client side of a run can reach (and preflight) the second IPs.
        _run(["ip", "addr", "add", f"{subnet.network_address + 1}/24", "dev", bridge])
        _run(["ip", "link", "set", bridge, "up"])
        for h in self.hosts:
            veth = f"{self.tag}w{h.index + 1}"
            h.second_ip = str(subnet.network_address + 11 + h.index)
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth1", "netns", h.netns])
            _run(["ip", "link", "set", veth, "master", bridge, "up"])
            self.netns_exec(h, ["ip", "addr", "add", f"{h.second_ip}/24", "dev", "eth1"])
            self.netns_exec(h, ["ip", "link", "set", "eth1", "up"])
        return {h.name: h.second_ip for h in self.hosts}

    # ---- lifecycle -----------------------------------------------------------------
    def start(self) -> Lab:
        reason = lab_unavailable_reason()
        if reason:
            raise LabError(reason)
        cleanup_stale()
        # The state folder appears with its owner already written (made aside,
        # then renamed): a cleanup_stale of another test worker at that moment
        # must not take a folder without owner.pid for a crashed run's.
        aside = STATE_ROOT / f".{STATE_PREFIX}{self.id}.new"
        aside.mkdir(mode=0o700)
        (aside / "owner.pid").write_text(str(os.getpid()))
        aside.rename(self.state)
        self.bin_dir.mkdir()
        for tmp in [self.client_tmp] + [self.host_tmp(h) for h in self.hosts]:
            tmp.mkdir()
            if self.shares_kernels:
                KERNEL_CACHE.mkdir(exist_ok=True)
                (tmp / "mlx").symlink_to(KERNEL_CACHE)
        if self.shares_kernels:  # first on every host's PATH (and the lab env's)
            shutil.copy2(KERNEL_CC / "g++", self.bin_dir / "g++")
        for disk in [self.disk] + [self.host_disk(h) for h in self.hosts]:
            disk.mkdir()
        if self.no_project:
            for home in [self.home] + [self.host_home(h) for h in self.hosts]:
                home.mkdir()
        self._make_keys()
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        Path("/run/sshd").mkdir(exist_ok=True)
        for h in self.hosts:
            _run(["ip", "netns", "add", h.netns])
            _run(["ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0",
                  "netns", h.netns])
            _run(["ip", "link", "set", h.veth, "master", self.bridge, "up"])
            self.netns_exec(h, ["ip", "addr", "add", f"{h.ip}/24", "dev", "eth0"])
            while h.small_disks and h.sshd is not None:  # its mount namespace is sshd's
                _run(["nsenter", "-t", str(h.sshd.pid), "-m", "umount", h.small_disks.pop()])
            h.small_disks.clear()
            self.netns_exec(h, ["ip", "link", "set", "eth0", "up"])
            self.netns_exec(h, ["ip", "link", "set", "lo", "up"])
            self._start_sshd(h)
        self._write_known_hosts()
        self._write_client_files()
        for h in self.hosts:
            self._wait_ssh(h)
        return self

    def stop(self) -> None:
        """Tear down everything this lab made. Safe to call twice."""
        for h in self.hosts:
            _stop_process(h.sshd)
            h.sshd = None
        _destroy(self.id)

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- internals -----------------------------------------------------------------
    def _make_keys(self) -> None:
        for key in (self.key, self.host_key):
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"mlxcluster-lab-{self.id}",
                  "-f", str(key)])
        (self.state / "authorized_keys").write_text(Path(f"{self.key}.pub").read_text())

    def _sshd_config(self, h: LabHost) -> Path:
        # sshd's own limits (MaxSessions 10 per connection, MaxStartups
        # 10:30:100) are left at their defaults, as on a Mac, so a tool that
        # opens too many sessions at once fails here as it would there.
        conf = self.state / f"sshd_{h.name}.conf"
        conf.write_text(
            f"ListenAddress {h.ip}\n"
            f"Port 22\nPort {SECOND_SSH_PORT}\n"
            f"HostKey {self.host_key}\n"
            f"AuthorizedKeysFile {self.state}/authorized_keys{' .ssh/authorized_keys' if self.own_ssh else ''}\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "PermitRootLogin yes\n"
            "StrictModes no\n"
            "UsePAM no\n"
            f"PidFile {self.state}/sshd_{h.name}.pid\n"
            f"SetEnv PATH={h.path} TMPDIR={self.host_tmp(h)}"
            f"{f' HOME={self.home}' if self.no_project else ''}\n"
        )
        return conf

    def _start_sshd(self, h: LabHost) -> None:
        conf = self._sshd_config(h)
        log = self.state / f"sshd_{h.name}.log"
        # `unshare --uts` gives the host its own hostname; Open MPI hangs when
        # every host reports the same one. `--mount` lets the host have its own
        # shell rc (see _shell_rc_mount). -D keeps sshd as our child (pid known).
        h.sshd = subprocess.Popen(
            ["ip", "netns", "exec", h.netns, "unshare", "--uts", "--mount", "sh", "-c",
             f"hostname {h.name} && {self._own_tmp_mount(h)}{self._own_disk_mount(h)}"
             f"{self._no_project_mount(h)}{self._shell_rc_mount()}{self._login_shell_mount(h)}"
             f"exec {SSHD} -D -f {conf} -E {log}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _own_disk_mount(self, h: LabHost) -> str:
        """Shell words that put the host's own directory at ``lab.disk`` (see ``disk``).

        `unshare --mount` makes the namespace's mounts private, so the bind
        mount is seen by this sshd and everything it starts, and by no one else.
        """
        own_stacks = shlex.quote(str(self.state / f"stacks{h.index + 1}"))
        return (f"mount --bind {shlex.quote(str(self.host_disk(h)))} "
                f"{shlex.quote(str(self.disk))} && "
                # The ranks' stack dumps and pid files too (mlxcluster.jobs.rank_wrapper
                # STACKS_ROOT): a stall is diagnosed over ssh, as on Macs.
                f"mkdir -p {RANK_STACKS} {own_stacks} && mount --bind {own_stacks} {RANK_STACKS} && ")

    def _own_tmp_mount(self, h: LabHost) -> str:
        """With ``own_tmp``: shell words that give the host a /tmp of its own
        (``<state>/tmp<i>``), as a Mac has, so that what a command stages
        under /tmp on one host (smoke's worker, launchers' files) is on that
        host only. What the lab itself keeps under the real /tmp stays seen
        at its path: the lab's state folder, and the repository and its venv
        when they lie under /tmp (the same software on every Mac)."""
        if not self.own_tmp:
            return ""
        real = f"/run/{STATE_PREFIX}{self.id}/h{h.index + 1}"
        keep = [self.state] + [p for p in (Path(__file__).resolve().parents[2],
                                           Path(sys.prefix).resolve(), KERNEL_CACHE)
                               if p.is_relative_to("/tmp") and (p != KERNEL_CACHE or self.shares_kernels)]
        words = [f"mkdir -p {shlex.quote(real)} {shlex.quote(str(self.state / f'tmp{h.index + 1}'))}",
                 f"mount --rbind /tmp {shlex.quote(real)}",
                 f"mount --bind {shlex.quote(str(self.state / f'tmp{h.index + 1}'))} /tmp",
                 "chmod 1777 /tmp"]
        for path in keep:
            inside = shlex.quote(f"{real}/{path.relative_to('/tmp')}")
            words += [f"mkdir -p {shlex.quote(str(path))}", f"mount --bind {inside} {shlex.quote(str(path))}"]
        return " && ".join(words) + " && "

    def _no_project_mount(self, h: LabHost) -> str:
        """With ``no_project``: shell words that hide this project from the
        host, as on a Mac that has only a python with mlx: an empty folder
        over the checkout, with the venv (the hosts' python, when it lies
        inside the checkout) bound back at its path. The host's HOME is its
        own too (``home``, set by sshd's SetEnv), as each Mac has its own
        ~/.cache."""
        if not self.no_project:
            return ""
        repo = Path(__file__).resolve().parents[2]
        empty = self.state / "no_project"
        words = []
        kept = [p for p in (Path(sys.prefix).resolve(),) if p.is_relative_to(repo)]
        for i, path in enumerate(kept):  # bound aside first: the checkout's path is hidden next
            aside = self.state / f"kept{h.index + 1}_{i}"
            words += [f"mkdir -p {shlex.quote(str(aside))} "
                      f"{shlex.quote(str(empty / path.relative_to(repo)))}",
                      f"mount --bind {shlex.quote(str(path))} {shlex.quote(str(aside))}"]
        words.append(f"mkdir -p {shlex.quote(str(empty))} && "
                     f"mount --bind {shlex.quote(str(empty))} {shlex.quote(str(repo))} && "
                     f"mount --bind {shlex.quote(str(self.host_home(h)))} {shlex.quote(str(self.home))}")
        words += [f"mount --bind {shlex.quote(str(self.state / f'kept{h.index + 1}_{i}'))} "
                  f"{shlex.quote(str(path))}" for i, path in enumerate(kept)]
        return " && ".join(words) + " && "

    def _shell_rc_mount(self) -> str:
        """Shell words that give the host's sessions an empty ~/.bashrc.

        sshd runs every command through the login shell, and bash run by sshd
        sources ~/.bashrc even when not interactive. This machine's root
        .bashrc runs `pyenv init` (~0.1 CPU-s per session), which a Mac does
        not: its login shell is zsh, which non-interactively reads only
        ~/.zshenv. The hosts' PATH comes from sshd's SetEnv instead.
        """
        rc = Path(pwd.getpwnam("root").pw_dir) / ".bashrc"
        if not rc.is_file():
            return ""
        empty = self.state / "host_bashrc"
        empty.write_text("# lab host: non-interactive sessions read nothing (like zsh on a Mac)\n")
        return f"mount --bind {shlex.quote(str(empty))} {shlex.quote(str(rc))} && "

    def _login_shell_mount(self, h: LabHost) -> str:
        """Shell words that make root's login shell ``h.login_shell`` (zsh,
        as on a Mac, unless a test set another) for this host's sshd: a copy
        of /etc/passwd with root's shell changed, bind-mounted in the host's
        mount namespace (this machine's own root keeps bash). With
        ``own_ssh`` root's home there is ``home`` (each host's own): ssh and
        sshd take ~ from the passwd entry, not from $HOME, so each host's ssh
        uses its own ~/.ssh and its sshd also reads its own
        ~/.ssh/authorized_keys (beside the lab's file, which authorizes this
        machine's key only)."""
        passwd = self.state / f"host_passwd_{h.login_shell}{'_own_home' if self.own_ssh else ''}"
        if not passwd.exists():
            shell = shutil.which(h.login_shell, path=SYSTEM_PATH)
            lines = []
            for line in Path("/etc/passwd").read_text().splitlines():
                fields = line.split(":")
                if len(fields) == 7 and fields[0] == "root":
                    fields[6] = shell
                    if self.own_ssh:
                        fields[5] = str(self.home)
                lines.append(":".join(fields))
            passwd.write_text("\n".join(lines) + "\n")
        return f"mount --bind {shlex.quote(str(passwd))} /etc/passwd && "

    def _restart_sshd(self, h: LabHost) -> None:
        _stop_process(h.sshd)
        self._start_sshd(h)
        self._wait_ssh(h)

    def _wait_ssh(self, h: LabHost, timeout: float = 15.0) -> None:
        if "link_down" in h.faults or h.sshd is None:
            return
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            proc = self.ssh(h, "true", timeout=10)
            if proc.returncode == 0:
                return
            last = proc.stderr.strip()
            time.sleep(0.1)
        raise LabError(f"{h.name} ({h.ip}): ssh not ready after {timeout:.0f}s: {last}")

    def _write_known_hosts(self, exclude: set[str] = frozenset()) -> None:
        pub = Path(f"{self.host_key}.pub").read_text().split()
        lines = [f"{h.ip},{h.name},[{h.ip}]:{SECOND_SSH_PORT} {pub[0]} {pub[1]}" for h in self.hosts
                 if h.ip not in exclude and h.name not in exclude]
        self.known_hosts.write_text("\n".join(lines) + ("\n" if lines else ""))

    def _write_client_files(self) -> None:
        aliases = "".join(f"Host {h.name}\n  HostName {h.ip}\n" for h in self.hosts)
        net = ipaddress.ip_network(self.subnet)
        pattern = ".".join(str(net.network_address).split(".")[:3]) + ".*"
        self.ssh_config.write_text(
            aliases
            + f"Host {pattern} labhost*\n"
            "  User root\n"
            f"  IdentityFile {self.key}\n"
            "  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.known_hosts}\n"
            "  StrictHostKeyChecking yes\n"
            "  BatchMode yes\n"
            "  ConnectTimeout 5\n"
            "  LogLevel ERROR\n"
        )
        self._write_ssh_wrapper()
        self._write_python_dispatch()

    def _write_ssh_wrapper(self) -> None:
        denied = "|".join(h.name for h in self.hosts if "no_host_to_host" in h.faults)
        deny = ""
        if self.own_ssh:
            # On a host: plain ssh with that host's own ~/.ssh (no -F, so
            # neither the lab's key nor its known_hosts), as ssh on a Mac.
            deny = (
                'case "$(cat /proc/sys/kernel/hostname)" in\n'
                f"  {'|'.join(h.name for h in self.hosts)})\n"
                + DROP_CONFIG_ARGS +
                '    exec /usr/bin/ssh "$@" ;;\n'
                "esac\n"
            )
        elif denied:
            # Keep every argument but -F FILE / -FFILE: a launcher's wrapper
            # passing the lab config must not bring the lab key back.
            deny = (
                'case "$(cat /proc/sys/kernel/hostname)" in\n'
                f"  {denied})\n"
                f'    echo "$(cat /proc/sys/kernel/hostname) $*" >> {self.host_to_host_log}\n'
                + DROP_CONFIG_ARGS +
                f'    exec /usr/bin/ssh -F {self.untrusted_config} "$@" ;;\n'
                "esac\n"
            )
        wrapper = self.bin_dir / "ssh"
        tmp = self.bin_dir / ".ssh.tmp"
        tmp.write_text(f'#!/bin/sh\n{deny}exec /usr/bin/ssh -F {self.ssh_config} "$@"\n')
        tmp.chmod(0o755)
        tmp.replace(wrapper)

    def _write_python_dispatch(self) -> None:
        # One path for every host (MLX wants that); the hostname picks the interpreter.
        cases = "".join(f"  {h.name}) exec {h.python} \"$@\" ;;\n" for h in self.hosts if h.python)
        script = self.bin_dir / "python"
        tmp = self.bin_dir / ".python.tmp"
        tmp.write_text(
            "#!/bin/sh\n"
            f'case "$(cat /proc/sys/kernel/hostname)" in\n{cases}'
            f'  *) exec {self.default_python} "$@" ;;\nesac\n'
        )
        tmp.chmod(0o755)
        tmp.replace(script)


# Labs started at the same moment (parallel test workers, a bench beside a
# test run) each claim their subnet under one lock, in a file naming the
# lab and its owner: between the choice and the bridge's address another lab
# could not see it in `ip addr` yet. A claim whose owner is gone is free.
SUBNET_CLAIMS = Path("/run/mlxcluster-lab-subnets")


def _free_subnet(lab_id: str) -> str:
    """A 10.77.K.0/24 that no interface here uses and no other live lab claimed."""
    SUBNET_CLAIMS.mkdir(exist_ok=True)
    with open(SUBNET_CLAIMS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        used = _run(["ip", "-o", "-4", "addr", "show"]).stdout
        start = secrets.randbelow(230)
        for k in [20 + (start + i) % 230 for i in range(230)]:
            claim = SUBNET_CLAIMS / f"10.77.{k}"
            if f"10.77.{k}." in used or _claimed(claim):
                continue
            claim.write_text(f"{os.getpid()} {lab_id}\n")
            return f"10.77.{k}.0/24"
    raise LabError("no free 10.77.K.0/24 subnet for the lab")


def _claimed(claim: Path) -> bool:
    """Whether a subnet's claim file names a lab whose owner still runs."""
    return _names_a_live_process(claim)


def _names_a_live_process(path: Path) -> bool:
    """Whether the file's first word is the pid of a process that runs."""
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    return psutil.pid_exists(pid)


def _release_subnets(lab_id: str) -> None:
    for claim in SUBNET_CLAIMS.glob("10.77.*"):
        with contextlib.suppress(OSError, IndexError):
            if claim.read_text().split()[1] == lab_id:
                claim.unlink()


def _stop_process(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def _lab_namespaces(lab_id: str) -> list[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if n.startswith(f"{NAME_PREFIX}{lab_id}h")]


def _destroy(lab_id: str) -> None:
    """Remove every trace of lab ``lab_id``: processes, namespaces, links, files."""
    for ns in _lab_namespaces(lab_id):
        # Everything running inside the namespace: sshd, sessions, ranks a test started.
        for _ in range(3):
            pids = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.1)
        _run(["ip", "netns", "del", ns], check=False)
    links = _run(["ip", "-o", "link", "show"], check=False).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(f"{NAME_PREFIX}{lab_id}"):
            _run(["ip", "link", "del", name], check=False)
    shutil.rmtree(STATE_ROOT / f"{STATE_PREFIX}{lab_id}", ignore_errors=True)
    shutil.rmtree(STATE_ROOT / f".{STATE_PREFIX}{lab_id}.new", ignore_errors=True)
    _release_subnets(lab_id)
    # own_tmp's mount points: empty here (the mounts lived in the hosts' namespaces);
    # rmdir, never a recursive delete, removes nothing else if one were not.
    real = Path("/run") / f"{STATE_PREFIX}{lab_id}"
    for point in [*real.glob("h*"), real]:
        with contextlib.suppress(OSError):
            point.rmdir()


def _owner_alive(state_dir: Path) -> bool:
    return _names_a_live_process(state_dir / "owner.pid")


def cleanup_stale() -> list[str]:
    """Destroy labs whose owning process is gone (a crashed or killed run)."""
    removed = []
    for state_dir in STATE_ROOT.glob(f"{STATE_PREFIX}*"):
        if not _owner_alive(state_dir):
            lab_id = state_dir.name[len(STATE_PREFIX):]
            _destroy(lab_id)
            removed.append(lab_id)
    # Namespaces of ours with no state dir at all are leftovers too.
    out = _run(["ip", "netns", "list"], check=False).stdout
    for line in out.splitlines():
        ns = line.split()[0] if line.strip() else ""
        if ns.startswith(NAME_PREFIX) and "h" in ns[len(NAME_PREFIX):]:
            lab_id = ns[len(NAME_PREFIX):].split("h", 1)[0]
            if not (STATE_ROOT / f"{STATE_PREFIX}{lab_id}").exists():
                _destroy(lab_id)
                removed.append(lab_id)
    return removed


def our_namespaces() -> list[str]:
    """Every namespace any mlxcluster lab made that still exists."""
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines()
            if line.strip() and line.startswith(NAME_PREFIX)]


@contextlib.contextmanager
def start_lab(n: int, *, python: str | None = None, own_tmp: bool = False,
              no_project: bool = False, own_ssh: bool = False) -> Iterator[Lab]:
    """Bring up an n-host lab; tear it down on exit, error or Ctrl-C."""
    lab = Lab(n, python=python, own_tmp=own_tmp, no_project=no_project, own_ssh=own_ssh)
    try:
        lab.start()
        yield lab
    finally:
        lab.stop()
