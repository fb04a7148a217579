"""The OpenSSH client path: how ssh's failures are explained."""

from __future__ import annotations

from mlxcluster.openssh import explain_failure

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
