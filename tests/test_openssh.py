"""The OpenSSH client path: how ssh's failures are explained."""

from __future__ import annotations

from mlxcluster.ssh.openssh import explain_failure

# What OpenSSH 9.2 prints for a host whose key changed (abridged).
CHANGED_KEY_STDERR = """@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!
Host key for studio-1 has changed and you have requested strict checking.
Host key verification failed.
"""


def test_a_changed_host_key_is_called_changed_not_unknown():
    err = explain_failure("studio-1", 255, CHANGED_KEY_STDERR)
    assert err.kind == "host-key-mismatch"
    assert err.message == "ssh studio-1: host key changed"
    assert "ssh-keygen -R studio-1" in err.hint


def test_an_unknown_host_key_is_called_unknown():
    err = explain_failure("studio-1", 255, "No ED25519 host key is known for studio-1 and you have "
                          "requested strict checking.\nHost key verification failed.\n")
    assert err.kind == "unknown-host-key" and "accept the key" in err.hint


def test_our_ssh_calls_verify_host_keys_whatever_the_users_config_says(tmp_path):
    """A config that turns host key checking off (common on lab clusters) does
    not weaken our calls: options on the command line win over -F files, as
    ssh -G (which resolves the options without connecting) shows."""
    import subprocess

    from mlxcluster.ssh.openssh import ssh_argv

    config = tmp_path / "config"
    config.write_text("Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n")
    argv = ssh_argv("studio-1", "true", ssh_config=str(config))
    resolved = subprocess.run([argv[0], "-G", *argv[1:]], capture_output=True, text=True, timeout=30).stdout
    assert "stricthostkeychecking true" in resolved.splitlines()
    assert "batchmode yes" in resolved.splitlines()


def test_a_target_is_never_read_as_an_option(tmp_path):
    """'--' ends ssh's options: even a target that slipped past validation is a host name."""
    import subprocess

    from mlxcluster.ssh.openssh import ssh_argv

    flag = tmp_path / "ran"
    argv = ssh_argv(f"-oProxyCommand=touch {flag}", "true", connect_timeout=1)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 255 and not flag.exists()
