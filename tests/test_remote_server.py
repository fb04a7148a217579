"""ParamikoRunner against a real paramiko SSH server on 127.0.0.1 in this
process: no prompt on a second-factor request, a bounded exec request, and
known_hosts files that are appended to safely and read with a clear error.

The server listens on an ephemeral loopback port only; every wait in it is
bounded, and teardown releases whatever a test made it wait for."""

from __future__ import annotations

import io
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mlxcluster.ssh.remote import ParamikoRunner, exec_bounded
from mlxcluster.ssh.results import SshError

# A traceback in a runner's helper thread (its exec timer) fails the test.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

# Longest a server handler may wait; the runner's limits under test are shorter.
SERVER_WAIT = 8.0


def new_key() -> tuple[paramiko.Ed25519Key, str]:
    """A fresh Ed25519 key (paramiko cannot generate one) and its OpenSSH private text."""
    text = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode("ascii")
    return paramiko.Ed25519Key(file_obj=io.StringIO(text)), text


class Behaviour(paramiko.ServerInterface):
    """What the test server does: accept one client key, optionally only as a
    first factor (then it offers keyboard-interactive), and answer each exec
    request after ``exec_delay`` seconds (bounded by the ``release`` event)."""

    def __init__(self, client_key: paramiko.PKey, release: threading.Event, *,
                 partial: bool = False, exec_delay: float = 0.0):
        self.client_key = client_key
        self.release = release
        self.partial = partial
        self.exec_delay = exec_delay
        self.interactive_requests = 0
        self.commands: list[str] = []

    def get_allowed_auths(self, username: str) -> str:
        return "keyboard-interactive" if self.partial else "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        if key.asbytes() != self.client_key.asbytes():
            return paramiko.AUTH_FAILED
        return paramiko.AUTH_PARTIALLY_SUCCESSFUL if self.partial else paramiko.AUTH_SUCCESSFUL

    def check_auth_interactive(self, username: str, submethods: str):
        self.interactive_requests += 1
        return paramiko.InteractiveQuery("Duo two-factor login", "Enter a passcode", ("Passcode: ", False))

    def check_auth_interactive_response(self, responses) -> int:
        return paramiko.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return paramiko.OPEN_SUCCEEDED
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        if self.exec_delay:
            # Runs in the server transport's thread: the exec reply waits too.
            self.release.wait(min(self.exec_delay, SERVER_WAIT))
            return True
        self.commands.append(command.decode())
        # Answer now, in this thread, so it all precedes the exec reply in
        # order; EOF but no close, which would fail the client's exec wait.
        channel.sendall(b"ran: " + command)
        channel.send_exit_status(0)
        channel.shutdown_write()
        return True


class Server:
    """A paramiko SSH server on 127.0.0.1:<ephemeral> with a fresh host key."""

    def __init__(self, behaviour: Behaviour):
        self.behaviour = behaviour
        self.host_key, _ = new_key()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.transports: list[paramiko.Transport] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            transport = paramiko.Transport(sock)
            transport.add_server_key(self.host_key)
            self.transports.append(transport)
            transport.start_server(threading.Event(), server=self.behaviour)

    def known_hosts_line(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.host_key.get_name()} {self.host_key.get_base64()}\n"

    def stop(self) -> None:
        self.stopping.set()
        self.behaviour.release.set()
        self.listener.close()
        for transport in self.transports:
            transport.close()
        self.thread.join(timeout=5)


class Lab:
    """A server plus the client side's files: key, ssh_config, known_hosts."""

    def __init__(self, tmp_path: Path, **behaviour):
        client_key, private_text = new_key()
        self.key_file = tmp_path / "id_test"
        self.key_file.write_text(private_text)
        self.key_file.chmod(0o600)
        self.server = Server(Behaviour(client_key, threading.Event(), **behaviour))
        self.known_hosts = tmp_path / "known_hosts"
        self.known_hosts.write_text(self.server.known_hosts_line())
        self.ssh_config = tmp_path / "ssh_config"
        self.ssh_config.write_text(
            "Host testserver\n"
            "  HostName 127.0.0.1\n"
            f"  Port {self.server.port}\n"
            "  User tester\n"
            f"  IdentityFile {self.key_file}\n"
            "  IdentityAgent none\n"
            f"  UserKnownHostsFile {self.known_hosts}\n"
        )

    def runner(self, **kwargs) -> ParamikoRunner:
        kwargs.setdefault("connect_timeout", 3.0)
        return ParamikoRunner(str(self.ssh_config), **kwargs)


@pytest.fixture
def make_server_lab(tmp_path) -> Iterator[Callable[..., Lab]]:
    """make_server_lab(**behaviour): at most one server per test, stopped at teardown.
    (Not conftest's make_lab, which starts sshd hosts in network namespaces: this
    server runs in this process and needs no lab.)"""
    made: list[Lab] = []

    def make(**behaviour) -> Lab:
        made.append(Lab(tmp_path, **behaviour))
        return made[-1]

    try:
        yield make
    finally:
        for each in made:
            each.server.stop()


def test_server_runs_a_command(make_server_lab):
    lab = make_server_lab()
    """The fixture works: a plain key login and a command, exec timer cancelled."""
    with lab.runner(command_timeout=5.0) as runner:
        result = runner.run("testserver", "echo hi")
        assert (result.stdout, result.exit_status) == ("ran: echo hi", 0)
        time.sleep(0.1)  # nothing closes the cached connection afterwards
        assert runner.run("testserver", "true").stdout == "ran: true"
    assert lab.server.behaviour.commands == ["echo hi", "true"]


class NoStdin:
    """A stdin that counts and refuses every read: input() would call readline."""

    def __init__(self):
        self.reads = 0

    def _refuse(self, *args):
        self.reads += 1
        raise AssertionError("mlxcluster read stdin (a prompt)")

    read = readline = readlines = _refuse

    def isatty(self) -> bool:
        return False


def test_second_factor_request_fails_without_prompting(make_server_lab, monkeypatch, capsys):
    """A key accepted only as a first factor, keyboard-interactive offered:
    paramiko's SSHClient would print the server's text and read stdin."""
    lab = make_server_lab(partial=True)
    stdin = NoStdin()
    monkeypatch.setattr(sys, "stdin", stdin)
    started = time.monotonic()
    with lab.runner() as runner, pytest.raises(SshError) as caught:
        runner.run("testserver", "true")
    assert time.monotonic() - started < 5
    assert stdin.reads == 0
    assert lab.server.behaviour.interactive_requests == 0  # not even asked for
    assert capsys.readouterr().out == ""
    err = caught.value
    assert err.kind == "auth", err
    assert "keyboard-interactive" in str(err) and "never prompts" in str(err)
    assert "key-only" in err.hint and "AuthenticationMethods" in err.hint
    assert lab.server.behaviour.commands == []


def test_run_times_out_when_the_exec_reply_is_late(make_server_lab):
    lab = make_server_lab(exec_delay=6.0)
    with lab.runner() as runner:
        runner.connect("testserver")
        started = time.monotonic()
        with pytest.raises(SshError) as caught:
            runner.run("testserver", "true", timeout=2)
        elapsed = time.monotonic() - started
    assert elapsed < 2 + 1.5, elapsed
    err = caught.value
    assert err.kind == "command-timeout", err
    assert "testserver" in str(err) and "2 s" in str(err)


def test_start_times_out_when_the_exec_reply_is_late(make_server_lab):
    lab = make_server_lab(exec_delay=6.0)
    with lab.runner(command_timeout=2.0) as runner:
        runner.connect("testserver")
        started = time.monotonic()
        with pytest.raises(SshError) as caught:
            runner.start("testserver", "sleep 100")
        elapsed = time.monotonic() - started
    assert elapsed < 2 + 1.5, elapsed
    assert caught.value.kind == "command-timeout", caught.value
    assert "testserver" in str(caught.value) and "2 s" in str(caught.value)


class LateChannel:
    """A channel whose exec reply never comes and whose close() fails after
    waking the waiter, as paramiko's does when the connection closes meanwhile."""

    def __init__(self):
        self.woken = threading.Event()

    def exec_command(self, command: str) -> None:
        self.woken.wait(SERVER_WAIT)
        raise paramiko.SSHException("Channel closed.")

    def close(self) -> None:
        self.woken.set()
        raise EOFError()


def test_exec_timer_swallows_a_failing_close(monkeypatch):
    """Deterministic form of a race seen with the real server: no traceback
    may escape the timer thread (a doctor run would print it on stderr)."""
    escaped = []
    monkeypatch.setattr(threading, "excepthook", escaped.append)
    channel = LateChannel()
    started = time.monotonic()
    with pytest.raises(SshError) as caught:
        exec_bounded(channel, "true", 0.2, "studio-1", 0.2)
    assert time.monotonic() - started < 2
    assert caught.value.kind == "command-timeout"
    for thread in threading.enumerate():
        if isinstance(thread, threading.Timer):
            thread.join(timeout=2)
    assert escaped == []


def test_new_host_key_is_appended_on_its_own_line(make_server_lab):
    """Trust on first use after an entry without a trailing newline (a
    hand-edited file): both keys must still load."""
    lab = make_server_lab()
    other, _ = new_key()
    lab.known_hosts.write_text(f"other.example {other.get_name()} {other.get_base64()}")  # no newline
    with lab.runner(accept_new_host_keys=True) as runner:
        assert runner.run("testserver", "true").exit_status == 0
    keys = paramiko.HostKeys(str(lab.known_hosts))
    assert keys.lookup("other.example")[other.get_name()] == other
    server_key = lab.server.host_key
    assert keys.lookup(f"[127.0.0.1]:{lab.server.port}")[server_key.get_name()] == server_key
    assert lab.known_hosts.read_text().endswith("\n")


@pytest.mark.parametrize("marker", ["@cert-authority *.example.com", "@revoked *"])
def test_known_hosts_marker_line_is_a_clear_error(make_server_lab, marker):
    """paramiko's HostKeys.load raises InvalidHostKey (not an SSHException)
    for OpenSSH's marker lines: reported per file and line, before any connect."""
    lab = make_server_lab()
    key, _ = new_key()
    with lab.known_hosts.open("a") as f:
        f.write(f"{marker} {key.get_name()} {key.get_base64()}\n")
    with lab.runner() as runner, pytest.raises(SshError) as caught:
        runner.connect("testserver")
    err = caught.value
    assert err.kind == "known-hosts", err
    assert f"{lab.known_hosts} line 2" in str(err) and marker.split()[0] in str(err)
    assert "UserKnownHostsFile" in err.hint
    assert lab.server.transports == []  # failed before connecting


def test_known_hosts_not_utf8_is_a_clear_error(make_server_lab):
    lab = make_server_lab()
    with lab.known_hosts.open("ab") as f:
        f.write(b"caf\xe9.example ssh-ed25519 AAAA\n")
    with lab.runner() as runner, pytest.raises(SshError) as caught:
        runner.connect("testserver")
    err = caught.value
    assert err.kind == "known-hosts", err
    assert str(lab.known_hosts) in str(err) and "UTF-8" in str(err)
    assert "UserKnownHostsFile" in err.hint
