"""A TCP relay: ``python tcp_relay.py LISTEN_HOST:PORT TARGET_HOST:PORT``.

The live deployment tier runs it beside the sandbox (docker/test/compose.live.yml) so that
the host can reach the sandbox, which sits on an internal network only. Standard library only;
one thread per direction of each connection. Not for production use.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _serve(client: socket.socket, target: tuple[str, int]) -> None:
    try:
        upstream = socket.create_connection(target, timeout=10)
    except OSError:
        client.close()
        return
    upstream.settimeout(None)
    threading.Thread(target=_pipe, args=(client, upstream), daemon=True).start()
    _pipe(upstream, client)


def main(listen: str, target: str) -> None:
    host, port = listen.rsplit(":", 1)
    target_host, target_port = target.rsplit(":", 1)
    server = socket.create_server((host, int(port)), reuse_port=True)
    while True:
        client, _ = server.accept()
        threading.Thread(target=_serve, args=(client, (target_host, int(target_port))),
                         daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
