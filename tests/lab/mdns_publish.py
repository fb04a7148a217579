"""A real Bonjour responder for lab tests, run inside a host's namespace:
publishes _ssh._tcp (port 22) and, with a model, _device-info._tcp like a Mac.

usage: mdns_publish.py INSTANCE IP MODEL|- SECONDS
"""
import socket
import sys
import time

from zeroconf import ServiceInfo, Zeroconf

instance, ip, model, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
server = instance.lower().replace(" ", "-") + ".local."
zc = Zeroconf(interfaces=[ip])
zc.register_service(ServiceInfo("_ssh._tcp.local.", f"{instance}._ssh._tcp.local.",
                                addresses=[socket.inet_aton(ip)], port=22, server=server))
if model != "-":
    zc.register_service(ServiceInfo("_device-info._tcp.local.", f"{instance}._device-info._tcp.local.",
                                    addresses=[socket.inet_aton(ip)], port=0,
                                    properties={"model": model}, server=server))
print("ready", flush=True)
time.sleep(seconds)
zc.close()
