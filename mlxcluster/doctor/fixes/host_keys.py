"""The fix for ``host-keys``: an unknown host key, saved after the user's yes.

The key is the one this machine's connection was offered during the checks
(``HostKeyUnknown`` carries it): the plan shows its fingerprint, and the same
key is appended to the known_hosts file mlxcluster reads for that host (the
one ``ssh HOST`` reads too, unless the ssh config says otherwise), as
``--accept-new-host-keys`` or answering yes to ssh would. A changed key is
never fixed here: that may be an attack, and the user decides.
"""

from __future__ import annotations

from mlxcluster.doctor.fixes.plan import Action, Fix, FixInput


def known_hosts_line(host_id: str, key_type: str, key_base64: str) -> str:
    """The known_hosts line for a key (``[host]:port`` ids as paramiko gives them)."""
    return f"{host_id} {key_type} {key_base64}"


# The host's public key file for each key type, where sshd keeps it (Linux and macOS).
_KEY_FILES = {"ssh-ed25519": "ed25519", "ssh-rsa": "rsa", "ecdsa-sha2-nistp256": "ecdsa",
              "ecdsa-sha2-nistp384": "ecdsa", "ecdsa-sha2-nistp521": "ecdsa"}


def plan_host_keys(fix: FixInput) -> list[Action]:
    actions = []
    for host, d in fix.result.fix_data.items():
        line = known_hosts_line(d["host_id"], d["key_type"], d["key_base64"])
        actions.append(Action(
            fix.result.id, (host,), "known-host",
            f"trust {d['host_id']}'s {d['key_type']} key {d['fingerprint']} (check it on the host: "
            f"ssh-keygen -lf /etc/ssh/ssh_host_{_KEY_FILES.get(d['key_type'], 'ed25519')}_key.pub)",
            [f"append to {d['known_hosts']}: {line}"], where="here",
            params={"file": d["known_hosts"], "line": line, "host_id": d["host_id"],
                    "fingerprint": d["fingerprint"]}))
    return actions


SAVE_HOST_KEYS = Fix("unknown host keys saved to known_hosts after the user's yes", plan_host_keys)
