"""Members and health as plain Python objects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional


@dataclass(frozen=True)
class Member:
    rank: int
    host: str
    pid: int
    incarnation: int


@dataclass(frozen=True)
class PeerHealth:
    """One row of this member's ledger: ``state`` is one of joining, alive, suspect, dead,
    departed; ``last_heard_s`` the seconds since this member last heard from the peer
    (None: never); ``evidence`` how a death or departure was established, in words."""

    rank: int
    state: str
    last_heard_s: Optional[float]
    evidence: Optional[str]


@dataclass(frozen=True)
class Health:
    rank: int
    epoch: int
    world: int
    peers: List[PeerHealth]
    async_error: Optional[BaseException]


def _health(d: dict) -> Health:
    peers = [PeerHealth(**p) for p in d.pop("peers")]
    return Health(peers=peers, **d)


def _members(rows: list) -> List[Member]:
    return [Member(**r) for r in rows]
