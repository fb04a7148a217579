"""Run commands on many hosts over SSH with paramiko, in parallel.

Honours the OpenSSH client config (Host, HostName, User, Port, IdentityFile,
ProxyJump, ProxyCommand, UserKnownHostsFile) and the SSH agent. Keys only:
no password is ever sent and nothing ever prompts. Every connect and every
command has a timeout. Unknown host keys raise ``HostKeyUnknown`` (with the
fingerprint and the fix) unless the runner was built with
``accept_new_host_keys=True`` (trust on first use: the key is then appended
to the known_hosts file, as ``ssh -o StrictHostKeyChecking=accept-new`` does).

Like fabric, ``run_parallel`` returns one ``Outcome`` per host (a value or an
error) after every host finished; it never raises for one host's failure.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import paramiko
from paramiko.hostkeys import InvalidHostKey

from mlxcluster.errors import InputError
from mlxcluster.ssh.results import CommandResult, Outcome, SshError

DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_COMMAND_TIMEOUT = 60.0
MAX_PARALLEL = 32

T = TypeVar("T")


def ssh_command(host_id: str) -> str:
    """'ssh HOST' for a known_hosts name, including the '[host]:port' form."""
    if host_id.startswith("[") and "]:" in host_id:
        host, port = host_id[1:].split("]:", 1)
        return f"ssh -p {port} {shlex.quote(host)}"
    return f"ssh {shlex.quote(host_id)}"


class HostKeyUnknown(SshError):
    """The server's host key is not in known_hosts."""

    def __init__(self, host_id: str, key_type: str, fingerprint: str, known_hosts: str,
                 key_base64: str | None = None):
        self.host_id = host_id
        self.key_type = key_type
        self.fingerprint = fingerprint
        # The key itself and where it would be saved: doctor --fix shows the
        # fingerprint and saves exactly this key after the user's yes.
        self.key_base64 = key_base64
        self.known_hosts = known_hosts
        host = host_id[1:].split("]:", 1)[0] if host_id.startswith("[") and "]:" in host_id else host_id
        super().__init__(
            "unknown-host-key",
            f"host key of {host_id} is unknown ({key_type} {fingerprint})",
            f"verify the fingerprint, then run '{ssh_command(host_id)}' once and answer yes, "
            f"or rerun with --accept-new-host-keys (saves it to {known_hosts})",
            target=shlex.quote(host),
        )


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style SHA256 fingerprint of a public key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


@dataclass(frozen=True)
class SshTarget:
    """Where and how to connect, after the OpenSSH config was applied."""

    alias: str  # what the user wrote (inventory ssh field)
    hostname: str
    port: int
    user: str | None
    key_files: tuple[str, ...] = ()
    proxy_jump: tuple[str, ...] = ()  # each "user@host:port" or an alias
    proxy_command: str | None = None
    known_hosts: tuple[str, ...] = ()
    use_agent: bool = True


def load_ssh_config(path: str | None) -> paramiko.SSHConfig:
    """Parse an OpenSSH client config file ('' / None => an empty config).
    A file paramiko cannot read is an InputError naming it (paramiko reads
    Match lines only when a host is looked up: one lookup here finds them)."""
    config = paramiko.SSHConfig()
    if path:
        p = Path(os.path.expanduser(path))
        if p.is_file():
            try:
                config.parse(io.StringIO(p.read_text(encoding="utf-8")))
                config.lookup("mlxcluster-config-check")
            except (paramiko.ssh_exception.ConfigParseError, UnicodeDecodeError, ValueError) as exc:
                raise InputError(f"ssh config {p} cannot be read: {exc}",
                                 f"fix that file ('ssh -G -F {p} HOST' shows how OpenSSH reads it)") from None
    return config


def resolve_target(
    config: paramiko.SSHConfig, alias: str, user: str | None = None, port: int | None = None
) -> SshTarget:
    """Apply the config's Host blocks to an ssh target; explicit user/port win."""
    entry = config.lookup(alias)
    proxy_jump = entry.get("proxyjump")
    proxy_command = entry.get("proxycommand")
    known = entry.get("userknownhostsfile")
    return SshTarget(
        alias=alias,
        hostname=entry.get("hostname", alias),
        port=int(port or entry.get("port", 22)),
        user=user or entry.get("user"),
        key_files=tuple(os.path.expanduser(k) for k in entry.get("identityfile", [])),
        proxy_jump=tuple(j.strip() for j in proxy_jump.split(",")) if proxy_jump and proxy_jump.lower() != "none" else (),
        proxy_command=proxy_command if proxy_command and proxy_command.lower() != "none" else None,
        known_hosts=tuple(os.path.expanduser(k) for k in known.split()) if known else (),
        use_agent=entry.get("identityagent", "").lower() != "none",
    )


def split_jump(spec: str) -> tuple[str, str | None, int | None]:
    """'user@host:port' -> (host, user, port); missing parts are None."""
    user = None
    if "@" in spec:
        user, spec = spec.rsplit("@", 1)
    port = None
    if spec.count(":") == 1:
        spec, port_text = spec.split(":")
        port = int(port_text)
    return spec, user, port


def open_tcp(hostname: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection with Nagle off.

    SSH exchanges many small packets that wait on each other; with Nagle's
    algorithm meeting the peer's delayed ACK each round trip can stall ~40 ms.
    Measured in the lab: handshake 60 -> 17 ms, each command 44 -> 4.4 ms.
    (OpenSSH turns Nagle off only for interactive sessions.)
    """
    sock = socket.create_connection((hostname, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class _PromptRefused(paramiko.AuthenticationException):
    """The server wants keyboard-interactive authentication after the key."""


class _NoPromptTransport(paramiko.Transport):
    """A Transport that refuses keyboard-interactive instead of prompting.

    When the server accepts a key only as a first factor and offers
    keyboard-interactive (or password), paramiko's SSHClient calls
    ``auth_interactive_dumb``, which prints the server's text and reads the
    answer with input(): a prompt nobody sees, that hangs a parallel run.
    """

    def auth_interactive_dumb(self, username, handler=None, submethods=""):
        raise _PromptRefused("the server asks for keyboard-interactive authentication "
                            "(a code or password); mlxcluster never prompts")


def known_hosts_error(path: str, exc: InvalidHostKey | UnicodeDecodeError) -> SshError:
    """A known_hosts file paramiko cannot load, naming the file and the line.

    paramiko skips lines it does not understand, except these, which stop the
    whole file: a key field that is not base64 (InvalidHostKey), which is
    where OpenSSH's marker lines put the key type, and a non-UTF-8 byte.
    Skipping a ``@revoked`` line would trust a revoked key, so this is an
    error for every host, not a warning.
    """
    hint = (f"edit {path}, or point UserKnownHostsFile (in the ssh config) for these hosts at "
            "a known_hosts holding only their plain host keys")
    if isinstance(exc, UnicodeDecodeError):
        return SshError("known-hosts", f"cannot read known_hosts {path}: not UTF-8 text ({exc.reason})", hint)
    lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    lineno = next((n for n, text in enumerate(lines, 1) if text.strip() == exc.line), "?")
    if exc.line.startswith("@"):
        problem = f"{exc.line.split()[0]} lines are not supported"
        hint = "mlxcluster (paramiko) cannot honour @cert-authority or @revoked lines: " + hint
    else:
        problem = f"the key is not valid base64 ({exc.exc})"
    return SshError("known-hosts", f"cannot read known_hosts {path} line {lineno}: {problem}: "
                    f"{exc.line[:60]!r}", hint)


class _KeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown keys with a HostKeyUnknown, or accept and save them."""

    def __init__(self, accept_new: bool, save_to: str, lock: threading.Lock):
        self.accept_new = accept_new
        self.save_to = save_to
        self.lock = lock

    def missing_host_key(self, client, hostname, key):
        if not self.accept_new:
            raise HostKeyUnknown(hostname, key.get_name(), fingerprint(key), self.save_to, key.get_base64())
        client.get_host_keys().add(hostname, key.get_name(), key)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n".encode()
        with self.lock:
            path = Path(self.save_to)
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a+b") as f:
                # A last line without its newline (a hand edit) would be
                # joined with ours into one unreadable line.
                if f.seek(0, os.SEEK_END) > 0:
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":
                        line = b"\n" + line
                f.write(line)


def classify(exc: BaseException, target: SshTarget) -> SshError:
    """Map a connect exception to an SshError with a cause and a fix."""
    where = f"{target.hostname}:{target.port}"
    if target.alias != target.hostname:
        where = f"{target.alias} ({where})"
    if isinstance(exc, SshError):
        return exc
    if isinstance(exc, paramiko.BadHostKeyException):
        return SshError(
            "host-key-mismatch",
            f"host key of {where} CHANGED: expected {fingerprint(exc.expected_key)}, got {fingerprint(exc.key)}",
            f"if the host was reinstalled, remove the old key: ssh-keygen -R {shlex.quote(target.hostname)}",
            target=shlex.quote(target.hostname),
        )
    if isinstance(exc, _PromptRefused):
        user = target.user or os.environ.get("USER", "?")
        return SshError(
            "auth",
            f"key authentication as {user} on {where} is not enough: {exc}",
            "allow key-only login for this user (sshd_config: AuthenticationMethods publickey, "
            "e.g. in a 'Match User' block), or use a key the server accepts alone",
        )
    if isinstance(exc, paramiko.AuthenticationException):
        user = target.user or os.environ.get("USER", "?")
        return SshError(
            "auth",
            f"key authentication as {user} on {where} failed: {exc}",
            f"install your public key: ssh-copy-id {shlex.quote(user + '@' + target.hostname)} "
            "(or load it into ssh-agent); password logins are never used",
            target=target.hostname,
        )
    if isinstance(exc, socket.gaierror):
        return SshError("dns", f"cannot resolve {target.hostname}: {exc}",
                        "check the ssh target / HostName, or use the host's IP")
    if isinstance(exc, TimeoutError):
        return SshError("timeout", f"connect to {where} timed out",
                        "host down, asleep, or a firewall drops port "
                        f"{target.port}; check the cable/Wi-Fi and 'Remote Login' in System Settings")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) and exc.errors:
        # One error per address tried; the first one names the cause.
        exc = next(iter(exc.errors.values()))
    if isinstance(exc, OSError):
        code = exc.errno
        if code in (111, 61):
            return SshError("refused", f"connection to {where} refused (no sshd listening)",
                            "enable Remote Login (System Settings > General > Sharing) or start sshd")
        if code in (113, 65, 101, 51):
            return SshError("unreachable", f"no route to {where}: {exc.strerror}",
                            "check the link and the IP plan (ip route / netstat -rn)")
        if code in (110, 60):
            return SshError("timeout", f"connect to {where} timed out", "host down or port dropped by a firewall")
    if isinstance(exc, paramiko.SSHException):
        return SshError("ssh", f"SSH to {where} failed: {exc}", "run 'ssh -v' to that host for details")
    return SshError("ssh", f"SSH to {where} failed: {type(exc).__name__}: {exc}", None)


class ParamikoRunner:
    """Connections cached per host alias; safe to use from many threads."""

    def __init__(
        self,
        ssh_config: str | None = None,
        *,
        known_hosts: str | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
        accept_new_host_keys: bool = False,
    ):
        self.config = load_ssh_config(ssh_config)
        self.known_hosts = known_hosts
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.accept_new_host_keys = accept_new_host_keys
        self._clients: dict[tuple[str, str | None, int | None], paramiko.SSHClient] = {}
        # The connections to ProxyJump hosts that carry the clients above:
        # closed with them (left open, each kept a session on its jump host
        # until this process ended).
        self._jumps: list[paramiko.SSHClient] = []
        self._lock = threading.Lock()
        self._save_lock = threading.Lock()

    def target(self, alias: str, user: str | None = None, port: int | None = None) -> SshTarget:
        return resolve_target(self.config, alias, user, port)

    def _known_hosts_files(self, target: SshTarget) -> list[str]:
        if self.known_hosts:
            return [self.known_hosts]
        return list(target.known_hosts) or [os.path.expanduser("~/.ssh/known_hosts")]

    def _open(self, target: SshTarget, depth: int = 0) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        files = self._known_hosts_files(target)
        for f in files:
            if os.path.isfile(f):
                try:
                    client.load_host_keys(f)
                except (InvalidHostKey, UnicodeDecodeError) as exc:
                    # Before any socket is opened: nothing to close.
                    raise known_hosts_error(f, exc) from exc
        client.set_missing_host_key_policy(_KeyPolicy(self.accept_new_host_keys, files[0], self._save_lock))
        sock: Any = None
        if target.proxy_jump and depth < 4:
            jump_host, jump_user, jump_port = split_jump(target.proxy_jump[-1])
            jump = self.target(jump_host, jump_user, jump_port)
            if len(target.proxy_jump) > 1:
                jump = SshTarget(**{**jump.__dict__, "proxy_jump": target.proxy_jump[:-1]})
            jump_client = self._open(jump, depth + 1)
            with self._lock:
                self._jumps.append(jump_client)
            try:
                sock = jump_client.get_transport().open_channel(
                    "direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0),
                    timeout=self.connect_timeout,
                )
            except Exception as exc:
                raise SshError("proxy", f"jump host {jump.alias} could not reach "
                               f"{target.hostname}:{target.port}: {exc}",
                               "check ProxyJump in your ssh config") from exc
        elif target.proxy_command:
            sock = paramiko.ProxyCommand(target.proxy_command)
        try:
            if sock is None:
                sock = open_tcp(target.hostname, target.port, self.connect_timeout)
        except Exception as exc:
            raise classify(exc, target) from exc
        try:
            client.connect(
                target.hostname, port=target.port, username=target.user,
                key_filename=list(target.key_files) or None, sock=sock,
                timeout=self.connect_timeout, banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout, channel_timeout=self.connect_timeout,
                allow_agent=target.use_agent, look_for_keys=True, password=None,
                transport_factory=_NoPromptTransport,
            )
        except Exception as exc:
            client.close()
            raise classify(exc, target) from exc
        return client

    def connect(self, alias: str, user: str | None = None, port: int | None = None) -> paramiko.SSHClient:
        """An open client for this target (cached), or raise SshError."""
        key = (alias, user, port)
        with self._lock:
            client = self._clients.get(key)
        if client is not None and client.get_transport() and client.get_transport().is_active():
            return client
        client = self._open(self.target(alias, user, port))
        with self._lock:
            self._clients[key] = client
        return client

    def run(
        self,
        alias: str,
        command: str,
        *,
        user: str | None = None,
        port: int | None = None,
        stdin: str | bytes | BinaryIO | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run one shell command line (caller quotes every argument); ``stdin``
        text, bytes, or a binary file streamed in pieces (a wheel sent to a host)."""
        client = self.connect(alias, user, port)
        limit = timeout or self.command_timeout
        started = time.monotonic()
        try:
            channel = client.get_transport().open_session(timeout=self.connect_timeout)
        except (paramiko.SSHException, EOFError, OSError):
            # The cached connection died since its last command (seen in CI: sshd
            # dropped it after a command that ended while its input was sent):
            # one new connection, once.
            with self._lock:
                self._clients.pop((alias, user, port), None)
            client.close()
            client = self.connect(alias, user, port)
            channel = client.get_transport().open_session(timeout=self.connect_timeout)
        try:
            channel.settimeout(limit)
            exec_bounded(channel, command, started + limit - time.monotonic(), alias, limit)
            if stdin is not None:
                send_input(channel, stdin.encode("utf-8") if isinstance(stdin, str) else stdin)
            channel.shutdown_write()
            out, err = read_channel(channel, started + limit)
            if not channel.exit_status_ready():
                raise SshError("command-timeout", f"{alias}: command did not finish within {limit:.0f} s",
                               "the host is overloaded or the command hangs")
            status = channel.recv_exit_status()
        except TimeoutError as exc:
            raise SshError("command-timeout", f"{alias}: command did not finish within {limit:.0f} s",
                           "the host is overloaded or the command hangs") from exc
        finally:
            channel.close()
        return CommandResult(out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                             status, time.monotonic() - started)

    def start(self, alias: str, command: str, *, user: str | None = None,
              port: int | None = None) -> paramiko.Channel:
        """Start a long-running command; the caller reads and closes the channel.

        The server must accept the command within ``command_timeout``."""
        client = self.connect(alias, user, port)
        channel = client.get_transport().open_session(timeout=self.connect_timeout)
        exec_bounded(channel, command, self.command_timeout, alias, self.command_timeout)
        return channel

    def peer_address(self, alias: str, user: str | None = None, port: int | None = None) -> str | None:
        """The IP this runner reached the host at (None through a proxy)."""
        try:
            peer = self.connect(alias, user, port).get_transport().getpeername()
        except (SshError, OSError, AttributeError, TypeError):
            return None
        return peer[0] if isinstance(peer, tuple) else None

    def close(self) -> None:
        """Close every connection this runner opened, the jump hosts' last."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
            jumps, self._jumps = self._jumps[::-1], []
        for c in clients + jumps:
            c.close()

    def __enter__(self) -> ParamikoRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_runner(ssh_config: str | None, *, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
                accept_new_host_keys: bool = False) -> ParamikoRunner:
    """The runner doctor and its fixes reach the inventory's hosts by (a
    HostRunner, ssh/runner.py; the caller closes it). Every doctor path opens
    its runner here, so one fake stands in for all of them in the tests."""
    return ParamikoRunner(ssh_config, connect_timeout=connect_timeout, command_timeout=command_timeout,
                          accept_new_host_keys=accept_new_host_keys)


def exec_bounded(channel: paramiko.Channel, command: str, seconds: float, alias: str, limit: float) -> None:
    """``channel.exec_command`` that gives up after ``seconds``.

    paramiko waits for the server's reply to the exec request with no
    timeout, so a server that delays it (or a link that dies right then)
    would block for as long as it likes. Closing the channel from a timer
    ends that wait. ``limit`` is the command's whole timeout, for the message.
    """
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        try:
            channel.close()
        except (paramiko.SSHException, OSError, EOFError):
            # close() wakes the waiter before it sends EOF and CLOSE; by then
            # the caller may be closing the connection: nothing left to do.
            pass

    timer = threading.Timer(max(0.0, seconds), expire)
    timer.daemon = True
    timer.start()
    try:
        channel.exec_command(command)
    except (paramiko.SSHException, OSError, EOFError):
        if not expired.is_set():
            raise
    finally:
        timer.cancel()
    if expired.is_set():  # also when it fired just after the reply: the channel is closed
        raise SshError("command-timeout", f"{alias}: the command was not started within {limit:.0f} s "
                       "(no reply to the exec request)", "the host is overloaded or the link is down")


def python_command(python: str, script: str, spec: dict) -> str:
    """``python -c SCRIPT JSON``, every argument quoted: how doctor runs its
    small standard-library helpers on a host."""
    return " ".join(shlex.quote(a) for a in (python, "-c", script, json.dumps(spec)))


def read_line(channel: paramiko.Channel, timeout: float) -> str | None:
    """The first stdout line of a running command, or None after ``timeout``."""
    deadline = time.monotonic() + timeout
    buf = bytearray()
    while b"\n" not in buf:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        channel.settimeout(min(remaining, 1.0))
        try:
            chunk = channel.recv(65536)
        except TimeoutError:
            continue
        if not chunk:  # EOF: the command ended
            break
        buf += chunk
    if not buf:
        return None
    return buf.split(b"\n", 1)[0].decode("utf-8", "replace")


def send_input(channel: paramiko.Channel, data: bytes | BinaryIO) -> None:
    """Send a command its stdin (bytes, or a binary file read 1 MiB at a
    time). A command that ends without reading it (a
    python that is not there: 'not found', exit 127) may have closed the
    channel first: paramiko then raises "Socket is closed", which would hide
    the command's own answer (its output and exit status, still to be read)."""
    try:
        if isinstance(data, (bytes, bytearray)):
            channel.sendall(data)
        else:
            for piece in iter(lambda: data.read(1 << 20), b""):
                channel.sendall(piece)
    except OSError:
        transport = channel.get_transport()
        if not channel.closed or transport is None or not transport.is_active():
            raise  # the connection itself is gone: that is the answer


def read_channel(channel: paramiko.Channel, deadline: float) -> tuple[bytes, bytes]:
    """Read stdout until EOF (blocking, no polling), then the buffered stderr,
    and wait for the exit status, all before ``deadline``."""
    out, err = bytearray(), bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return bytes(out), bytes(err)
        channel.settimeout(min(remaining, 1.0))
        try:
            chunk = channel.recv(65536)
        except TimeoutError:
            # Keep stderr flowing so a chatty command cannot fill the window.
            while channel.recv_stderr_ready():
                err += channel.recv_stderr(65536)
            continue
        if not chunk:
            break
        out += chunk
    channel.status_event.wait(max(0.0, deadline - time.monotonic()))
    while channel.recv_stderr_ready():
        err += channel.recv_stderr(65536)
    return bytes(out), bytes(err)


def run_parallel(names: Iterable[str], fn: Callable[[str], T], max_workers: int = MAX_PARALLEL) -> dict[str, Outcome[T]]:
    """Call fn(name) for every name in threads; one Outcome per name, never raises."""
    names = list(names)

    def one(name: str) -> Outcome[T]:
        started = time.monotonic()
        try:
            return Outcome(name, value=fn(name), seconds=time.monotonic() - started)
        except Exception as exc:  # collected per host, like fabric's GroupResult
            return Outcome(name, error=exc, seconds=time.monotonic() - started)

    if not names:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(names)))) as pool:
        results = list(pool.map(one, names))
    return {o.host: o for o in results}
