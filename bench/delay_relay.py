#!/usr/bin/env python3
"""A TCP relay that delays every byte by a fixed one-way time in each direction: a network link's latency for
the cluster benchmarks, on a kernel without netem. Bandwidth is not limited (tc's tbf on a veth does that).

    python3 bench/delay_relay.py LISTEN TARGET DELAY_MS     # e.g. 127.0.0.1:0 127.0.0.1:7471 1.0

Prints `listening on HOST:PORT` once it accepts connections; each connection is relayed to TARGET. Each direction
has a reader thread, which stamps every chunk with its arrival time, and a writer thread, which sleeps until the
chunk is DELAY_MS old and sends it: bytes keep their order, and the delay holds to about 0.1 ms (an event loop's
timers round up to whole milliseconds, which is why this uses threads). Nagle is off on both sides.
"""

import queue
import socket
import sys
import threading
import time


def pipe(src, dst, delay):
    chunks = queue.Queue()

    def read():
        try:
            while data := src.recv(1 << 16):
                chunks.put((time.monotonic() + delay, data))
        except OSError:
            pass
        chunks.put((time.monotonic() + delay, None))

    def write():
        while True:
            due, data = chunks.get()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if data is None:
                break
            try:
                dst.sendall(data)
            except OSError:
                break
        for s in (dst, src):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    threading.Thread(target=read, daemon=True).start()
    threading.Thread(target=write, daemon=True).start()


def main():
    listen, target, delay_ms = sys.argv[1], sys.argv[2], float(sys.argv[3])
    host, port = listen.rsplit(":", 1)
    th, tp = target.rsplit(":", 1)
    server = socket.create_server((host, int(port)))
    addr = server.getsockname()
    print(f"listening on {addr[0]}:{addr[1]}", flush=True)
    while True:
        client, _ = server.accept()
        try:
            upstream = socket.create_connection((th, int(tp)))
        except OSError:
            client.close()
            continue
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pipe(client, upstream, delay_ms / 1e3)
        pipe(upstream, client, delay_ms / 1e3)


if __name__ == "__main__":
    main()
