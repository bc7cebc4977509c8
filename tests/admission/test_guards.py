"""`_guards.Front`'s handshake starter on a real event loop: TLS handshakes start a few per
turn of the loop, in arrival order, and never for a client that left meanwhile."""

from __future__ import annotations

import asyncio
from collections import Counter

from webhook.admission._guards import HANDSHAKES_PER_TURN, Front


class _Conn:
    """What the starter needs of a connection: `gone` and `start_tls`."""

    def __init__(self, number: int, started: list[tuple[int, int]], turn: list[int]) -> None:
        self.number, self.started, self.turn = number, started, turn
        self.closed = asyncio.Event()

    def gone(self) -> bool:
        return self.closed.is_set()

    async def start_tls(self) -> None:
        self.started.append((self.number, self.turn[0]))


async def test_handshakes_start_a_few_per_turn_in_order_and_never_for_a_client_gone() -> None:
    turn = [0]
    started: list[tuple[int, int]] = []

    async def count_turns() -> None:
        while True:
            turn[0] += 1
            await asyncio.sleep(0)

    ticker = asyncio.get_running_loop().create_task(count_turns())
    front = Front()
    conns = [_Conn(i, started, turn) for i in range(40)]
    for conn in conns:
        front.handshake(conn)  # type: ignore[arg-type]
    for conn in conns[::3]:
        conn.closed.set()  # the client left before its handshake's turn came
    live = [c.number for c in conns if not c.closed.is_set()]
    for _ in range(200):
        if len(started) == len(live):
            break
        await asyncio.sleep(0)
    ticker.cancel()
    assert [n for n, _ in started] == live, "in arrival order, none for a client gone"
    per_turn = Counter(t for _, t in started)
    assert max(per_turn.values()) <= HANDSHAKES_PER_TURN and len(per_turn) > 1, per_turn
    front.handshake(_Conn(99, started, turn))  # type: ignore[arg-type]
    for _ in range(20):
        await asyncio.sleep(0)
    assert started[-1][0] == 99, "a later one starts a new round"
