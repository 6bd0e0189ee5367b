"""``TorchHooks``: what torch's own code asks a chorus group beyond the collectives: its
names, its "backend" (itself), what it supports, and the hooks torch calls on a group that
has them (``new_group`` on the default group, the backend ``shrink`` of
``dist.shrink_group``). A mixin of ``ChorusGroup``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import List, Optional

import torch.distributed as dist

from . import _shrink, _subgroup


class TorchHooks:
    """Names, capabilities and torch's hooks, over ``ChorusGroup``'s communicator."""

    def getBackendName(self) -> str:
        return "chorus"

    def name(self) -> str:
        return "chorus"

    # torch 2.15 hands new_group to the default group (on every rank of the world).
    def new_group(self, ranks: List[int], timeout: Optional[timedelta] = None, backend: object = None,
                  pg_options: object = None, group_name: str = "", group_desc: Optional[str] = None) -> Optional[dist.ProcessGroup]:
        """A subgroup, split from this group's communicator where that can be done (see
        ``chorus.torch._subgroup``), else met through the store; None on a non-member."""
        return _subgroup.new_group(self, list(ranks), timeout, backend or "chorus", pg_options, group_name, group_desc)

    # torch keeps a group's name in its C++ backends, and this group has none: it keeps
    # its own (DeviceMesh, functional collectives and the group registry read it).
    def _set_group_name(self, name: str) -> None:
        self._name = name

    setGroupName = _set_group_name

    @property
    def group_name(self) -> str:
        name = getattr(self, "_name", None)
        if name is None:
            raise RuntimeError("ProcessGroup name not set")
        return name

    def getGroupName(self) -> str:
        return self.group_name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    setGroupDesc = _set_group_desc

    @property
    def group_desc(self) -> str:
        return getattr(self, "_desc", "undefined")

    def getGroupDesc(self) -> str:
        return self.group_desc

    # torch asks the group for its "backend" in a few places (batch_isend_irecv to learn
    # that it coalesces, FSDP2 whether it allocates tensors): the group is its own.
    def _get_backend(self, device: object = None) -> "ProcessGroupChorus":
        return self

    supports_coalescing = True
    supports_splitting = False
    supports_shrinking = True  # dist.shrink_group
    supports_reconfigure = False  # why: see _shrink

    def shrink(self, ranks_to_exclude: List[int], shrink_flags: int = 0, opts_override: object = None) -> "BackendChorus":
        """torch's backend shrink hook (``dist.shrink_group``): the survivors' group. The
        agreed survivors must be everyone but ``ranks_to_exclude``."""
        return _shrink.backend_shrink(self, ranks_to_exclude, shrink_flags)

    def supports_tensor_alloc(self, device: object) -> bool:
        return False
