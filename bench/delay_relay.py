#!/usr/bin/env python3
"""A TCP relay that delays every byte by a fixed one-way time in each direction: a network link's latency for
the cluster benchmarks, on a kernel without netem. Bandwidth is not limited (tc's tbf on a veth does that).

    python3 bench/delay_relay.py LISTEN TARGET DELAY_MS     # e.g. 127.0.0.1:0 127.0.0.1:7471 1.0

Prints `listening on HOST:PORT` once it accepts connections; each connection is relayed to TARGET. Bytes keep
their order: each chunk read is written DELAY_MS after it arrived (Nagle off on both sides).
"""

import asyncio
import socket
import sys


async def pipe(reader, writer, delay):
    loop = asyncio.get_running_loop()
    try:
        while data := await reader.read(1 << 16):
            loop.call_later(delay, writer.write, data)
    except ConnectionError:
        pass
    loop.call_later(delay, writer.close)


def no_delay(writer):
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def main():
    listen, target, delay_ms = sys.argv[1], sys.argv[2], float(sys.argv[3])
    delay = delay_ms / 1e3
    th, tp = target.rsplit(":", 1)

    async def handle(cr, cw):
        try:
            tr, tw = await asyncio.open_connection(th, int(tp))
        except OSError:
            cw.close()
            return
        no_delay(cw)
        no_delay(tw)
        await asyncio.gather(pipe(cr, tw, delay), pipe(tr, cw, delay))

    host, port = listen.rsplit(":", 1)
    server = await asyncio.start_server(handle, host, int(port))
    addr = server.sockets[0].getsockname()
    print(f"listening on {addr[0]}:{addr[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
