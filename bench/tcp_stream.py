"""Raw TCP throughput of one link: a plain socket stream, the physical limit
the collectives are compared with.

    python tcp_stream.py recv PORT            # prints bytes and seconds received
    python tcp_stream.py send IP PORT SECONDS # streams 1 MiB writes for SECONDS
"""

import socket
import sys
import time

CHUNK = 1 << 20


def recv(port: int) -> None:
    with socket.create_server(("0.0.0.0", port)) as server:
        server.settimeout(30)
        print("LISTENING", flush=True)
        conn, _ = server.accept()
        with conn:
            total, started = 0, None
            while True:
                data = conn.recv(CHUNK)
                if not data:
                    break
                if started is None:
                    started = time.perf_counter()
                total += len(data)
            elapsed = time.perf_counter() - (started or time.perf_counter())
    print(f"RECEIVED {total} {elapsed:.6f}", flush=True)


def send(ip: str, port: int, seconds: float) -> None:
    payload = b"\0" * CHUNK
    for _ in range(100):
        try:
            conn = socket.create_connection((ip, port), timeout=10)
            break
        except ConnectionRefusedError:
            time.sleep(0.05)
    else:
        raise SystemExit(f"cannot connect to {ip}:{port}")
    with conn:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            conn.sendall(payload)


if __name__ == "__main__":
    if sys.argv[1] == "recv":
        recv(int(sys.argv[2]))
    else:
        send(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
