"""The exception classes: ``chorus.Error`` and one subclass per kind of ``chorus::Error``.

``str(e)`` starts with the stable ``[chorus:<kind>]`` token, so code that keeps only the
text (an RPC layer, a log scraper) can still tell what happened. The structured fields are
attributes. Exceptions pickle with their class, text and fields (Ray and multiprocessing
move them between processes that way).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Type

_FIELDS = (
    "rank",
    "peer",
    "epoch",
    "collective",
    "op",
    "step",
    "evidence",
    "waiting_on",
    "detail",
)


class Error(RuntimeError):
    """A chorus failure. Attributes: ``kind`` (the token's kind, e.g. ``"peer-failed"``),
    ``rank`` (this member), ``peer`` (the one that failed, departed or was waited on),
    ``epoch``, ``collective``, ``op``, ``step``, ``evidence`` (how the failure was
    established, in words), ``partial`` (True when the output buffer holds partial data),
    ``waiting_on`` and ``detail``; each None when not known."""

    kind: str = "error"
    token: str = "[chorus:error]"
    rank: Optional[int]
    peer: Optional[int]
    epoch: Optional[int]
    collective: Optional[str]
    op: Optional[int]
    step: Optional[int]
    evidence: Optional[str]
    waiting_on: Optional[int]
    detail: Optional[str]
    partial: bool

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.kind = fields.pop("kind", None) or type(self).kind
        self.partial = bool(fields.pop("partial", False))
        for name in _FIELDS:
            setattr(self, name, fields.pop(name, None))
        if fields:
            raise TypeError(f"unexpected fields {sorted(fields)}")

    def _fields(self) -> Dict[str, Any]:
        out = {name: getattr(self, name, None) for name in _FIELDS}
        out["kind"] = self.kind
        out["partial"] = self.partial
        return out

    def __reduce__(self):  # type: ignore[override]
        return (_rebuild, (type(self), str(self), self._fields()))


def _rebuild(cls: Type[Error], message: str, fields: Dict[str, Any]) -> Error:
    return cls(message, **fields)


def _kind(name: str, kind: str, doc: str, *bases: type) -> Type[Error]:
    cls = type(name, (Error,) + bases, {"kind": kind, "token": f"[chorus:{kind}]", "__doc__": doc})
    cls.__module__ = "chorus"
    return cls


Aborted = _kind("Aborted", "aborted", "The communicator (or an ancestor) was aborted locally.")
PeerFailed = _kind(
    "PeerFailed", "peer-failed", "A peer died (crash, freeze past the deadline, lost connection)."
)
PeerDeparted = _kind("PeerDeparted", "peer-departed", "A peer left explicitly.")
Timeout = _kind(
    "Timeout", "timeout", "A deadline passed (operation, init, agreement, teardown)."
)
Revoked = _kind("Revoked", "revoked", "The communicator was revoked; shrink or destroy it.")
Evicted = _kind(
    "Evicted",
    "evicted",
    "This member was declared dead by the others and is no longer part of the job.",
)
Mismatch = _kind(
    "Mismatch", "mismatch", "Ranks called different collectives (or with different arguments)."
)
InvalidArgument = _kind(
    "InvalidArgument", "invalid-argument", "An unusable argument (also a ValueError).", ValueError
)
ConfigError = _kind(
    "ConfigError", "config", "A CHORUS_* variable or launch environment is unusable."
)
Bootstrap = _kind(
    "Bootstrap",
    "bootstrap",
    "Bootstrap failed (root unreachable, duplicate rank, world mismatch, auth failed).",
)
TransportError = _kind(
    "TransportError",
    "transport",
    "A transport could not be set up or failed outside an operation.",
)
ProtocolError = _kind("ProtocolError", "protocol", "A peer sent bytes that violate the protocol.")
DeviceError = _kind("DeviceError", "device", "The memory device failed or is absent.")
Destroyed = _kind("Destroyed", "destroyed", "The communicator was destroyed.")
NoQuorum = _kind(
    "NoQuorum",
    "no-quorum",
    "A shrink or grow could not gather the votes its quorum needs.",
)
InternalError = _kind("InternalError", "internal", "A bug in chorus.")

_BY_KIND: Dict[str, Type[Error]] = {
    cls.kind: cls
    for cls in (
        Aborted,
        PeerFailed,
        PeerDeparted,
        Timeout,
        Revoked,
        Evicted,
        Mismatch,
        InvalidArgument,
        ConfigError,
        Bootstrap,
        TransportError,
        ProtocolError,
        DeviceError,
        Destroyed,
        NoQuorum,
        InternalError,
    )
}


def _from_rust(message: str, fields: Dict[str, Any]) -> Error:
    """The exception for a chorus::Error (called by the extension)."""
    return _BY_KIND.get(fields.get("kind", ""), Error)(message, **fields)


def from_text(message: str) -> Error:
    """The exception for a message that kept only its text: the class its token names."""
    for cls in _BY_KIND.values():
        if message.startswith(cls.token):
            return cls(message)
    return Error(message)
