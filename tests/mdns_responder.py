"""A tiny Bonjour responder for lab tests: announces _ssh._tcp and
_device-info._tcp (model=...) like a Mac, from one address, until stdin closes.

    ip netns exec NS python tests/mdns_responder.py IP "Instance Name" MODEL [SSH_PORT]
"""

from __future__ import annotations

import socket
import sys

from zeroconf import ServiceInfo, Zeroconf


def main() -> None:
    ip, instance, model = sys.argv[1], sys.argv[2], sys.argv[3]
    port = int(sys.argv[4]) if len(sys.argv) > 4 else 22
    server = instance.lower().replace(" ", "-") + ".local."
    zc = Zeroconf(interfaces=[ip])
    services = [
        ServiceInfo("_ssh._tcp.local.", f"{instance}._ssh._tcp.local.", port=port,
                    addresses=[socket.inet_aton(ip)], server=server),
        ServiceInfo("_device-info._tcp.local.", f"{instance}._device-info._tcp.local.", port=0,
                    properties={"model": model, "osxvers": "25"}, addresses=[socket.inet_aton(ip)],
                    server=server),
    ]
    for info in services:
        zc.register_service(info, allow_name_change=False)
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes our stdin
    for info in services:
        zc.unregister_service(info)
    zc.close()


if __name__ == "__main__":
    main()
