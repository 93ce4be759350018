"""service/frontends.py without an engine: the front ends' listening sockets, and what each process gets."""

from __future__ import annotations

import multiprocessing
import socket
import threading
from collections import Counter

import pytest

from service.admission import SharedSlots
from service.frontends import FrontendArgs, listening_sockets
from service.settings import GatewaySettings

pytestmark = pytest.mark.skipif(not hasattr(socket, "SO_REUSEPORT"), reason="SO_REUSEPORT: Linux and the BSDs")


def settings_on_any_port() -> GatewaySettings:
    return GatewaySettings(server={"host": "127.0.0.1", "port": 0})


def which_socket_accepted(sockets: tuple[socket.socket, ...], connections: int) -> Counter[int]:
    """Open `connections` at once to the sockets' port; count the connections each socket's queue received."""
    port = sockets[0].getsockname()[1]
    clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(connections)]
    counts: Counter[int] = Counter()
    try:
        for index, sock in enumerate(sockets):
            sock.setblocking(False)
            while True:
                try:
                    conn, _ = sock.accept()
                except BlockingIOError:
                    break
                conn.close()
                counts[index] += 1
    finally:
        for client in clients:
            client.close()
    return counts


def test_one_socket_per_front_end_on_one_port_and_the_kernel_spreads_connections_over_them() -> None:
    """Regression: with one shared socket the busiest of 4 front ends took up to 53 of a burst of 64
    (tools/frontend_spread.py); the kernel spreads connections over SO_REUSEPORT sockets by a hash."""
    sockets = listening_sockets(settings_on_any_port(), 4)
    try:
        assert len(sockets) == 4 and len({s.getsockname()[1] for s in sockets}) == 1
        assert all(s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) for s in sockets)
        counts = which_socket_accepted(sockets, 256)
        assert sum(counts.values()) == 256
        assert min(counts[i] for i in range(4)) >= 32, counts  # 64 expected each; 32 is 4.6 standard deviations off
    finally:
        for sock in sockets:
            sock.close()


def test_one_front_end_gets_one_plain_socket() -> None:
    (sock,) = listening_sockets(settings_on_any_port(), 1)
    try:
        assert not sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
    finally:
        sock.close()


def test_the_parents_sockets_keep_connections_waiting_while_no_front_end_accepts() -> None:
    """A group restarting: the parent still holds the sockets, so a new connection is queued, not refused."""
    sockets = listening_sockets(settings_on_any_port(), 2)
    try:
        port = sockets[0].getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        client.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        accepted: list[bytes] = []

        def accept_later() -> None:
            for sock in sockets:
                sock.settimeout(0.5)
                try:
                    conn, _ = sock.accept()
                except TimeoutError:
                    continue
                accepted.append(conn.recv(100))
                conn.close()

        thread = threading.Thread(target=accept_later)
        thread.start()
        thread.join(timeout=10)
        client.close()
        assert accepted and accepted[0].startswith(b"GET /health")
    finally:
        for sock in sockets:
            sock.close()


def test_front_end_args_give_each_front_end_its_own_socket() -> None:
    """(That they reach the spawned front ends through vLLM's process manager: tests/integration/test_frontends.py.)"""
    sockets = listening_sockets(settings_on_any_port(), 3)
    try:
        slots = SharedSlots(2, multiprocessing.get_context("spawn"))
        args = FrontendArgs(settings=settings_on_any_port(), slots=slots, sockets=sockets)
        assert [args.socket_for(i) for i in range(3)] == list(sockets)
        shared = FrontendArgs(settings=args.settings, slots=slots, sockets=sockets[:1])
        assert shared.socket_for(2) is sockets[0]  # one socket: every front end accepts on it
    finally:
        for sock in sockets:
            sock.close()
