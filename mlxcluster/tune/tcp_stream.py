"""Raw TCP throughput of one link over N parallel streams: the limit the
collectives are set against. Staged to a host on stdin and run there:

    python - recv PORT STREAMS          # prints LISTENING, then RECEIVED BYTES SECONDS
    python - send IP PORT STREAMS SECONDS

The receiver times from the first byte on any stream to the last on any, so
N streams that share the link are measured together. Standard library only
(it runs with the hosts' python).
"""

import socket
import sys
import threading
import time

CHUNK = 1 << 20
ACCEPT_TIMEOUT_S = 30


def recv(port, streams):
    marks = []  # (first byte time, last byte time, bytes) per stream
    lock = threading.Lock()

    def drain(conn):
        total, first, last = 0, None, None
        with conn:
            while True:
                data = conn.recv(CHUNK)
                if not data:
                    break
                last = time.perf_counter()
                first = first or last
                total += len(data)
        with lock:
            marks.append((first, last, total))

    with socket.create_server(("0.0.0.0", port), backlog=streams) as server:
        server.settimeout(ACCEPT_TIMEOUT_S)
        print("LISTENING", flush=True)
        threads = []
        for _ in range(streams):
            conn, _ = server.accept()
            conn.settimeout(ACCEPT_TIMEOUT_S)
            t = threading.Thread(target=drain, args=(conn,))
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
    firsts = [m[0] for m in marks if m[0] is not None]
    lasts = [m[1] for m in marks if m[1] is not None]
    elapsed = (max(lasts) - min(firsts)) if firsts else 0.0
    print(f"RECEIVED {sum(m[2] for m in marks)} {elapsed:.6f}", flush=True)


def send(ip, port, streams, seconds):
    payload = b"\0" * CHUNK
    conns = []
    for _ in range(streams):
        for _ in range(100):
            try:
                conns.append(socket.create_connection((ip, port), timeout=10))
                break
            except ConnectionRefusedError:
                time.sleep(0.05)
        else:
            raise SystemExit(f"cannot connect to {ip}:{port}")
    deadline = time.perf_counter() + seconds

    def pump(conn):
        with conn:
            while time.perf_counter() < deadline:
                conn.sendall(payload)

    threads = [threading.Thread(target=pump, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def parse_received(line):
    """'RECEIVED 1000 0.5' -> (1000, 0.5)."""
    _, total, elapsed = line.split()
    return int(total), float(elapsed)


if __name__ == "__main__":
    if sys.argv[1] == "recv":
        recv(int(sys.argv[2]), int(sys.argv[3]))
    else:
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
