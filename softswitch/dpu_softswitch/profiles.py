"""Action profiles and selectors as bmv2's data plane keeps them (bm_sim/action_profile.cpp).

A profile holds members (an action and its data) and groups (sets of members) by bmv2 handle; indirect
table entries point at a member handle or a group handle. Handles are bmv2's HandleMgr's: the lowest
free one. A group's members are kept in ascending handle order (bmv2's RandAccessUIntSet) and a packet
hitting a group takes member number hash % size, the hash being the profile's selector calculation
truncated to 32 bits (ActionProfile::hash_t is an unsigned int; PI's GroupSelection::get_from_hash).
Reference counts follow bmv2: a member or group used by a group or an entry cannot be deleted.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable
from typing import Any

# bmv2 runs no action at all for a lookup that yields an empty group (MatchTableIndirect::lookup returns
# an empty ActionEntry) and for a miss in a table whose JSON has no default_entry (p4c emits none for
# tables with an action profile); this pseudo action id stands for it.
NO_ACTION = -1
HASH_MASK = 0xFFFFFFFF


class ProfileError(Exception):
    """A bmv2 MatchErrorCode from an action profile or indirect table operation."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class Handles:
    """bmv2's HandleMgr: hands out the lowest handle not in use."""

    def __init__(self) -> None:
        self._next = 0
        self._released: list[int] = []  # a heap of released handles, all below _next
        self.used: set[int] = set()

    def get(self) -> int:
        """The lowest free handle, now in use."""
        h = heapq.heappop(self._released) if self._released else self._next
        if h == self._next:
            self._next += 1
        self.used.add(h)
        return h

    def release(self, h: int) -> None:
        """Free a handle in use."""
        self.used.remove(h)
        heapq.heappush(self._released, h)


class ActionProfile:
    """One action profile (with a selector when `selector` is set): members, groups and their references."""

    def __init__(self, name: str, selector: Callable[[Any], int] | None) -> None:
        self.name = name
        self.selector = selector
        # Member handle -> (JSON action id, action data). Like bmv2's action_entries, a released
        # handle's action stays until the handle is reused.
        self.actions: dict[int, tuple[int, list[int]]] = {}
        # Group handle -> member handles in ascending order; replaced whole on change, so that the
        # packet thread always sees a consistent list.
        self.groups: dict[int, list[int]] = {}
        self._members = Handles()
        self._groups = Handles()
        self._member_refs: dict[int, int] = {}
        self._group_refs: dict[int, int] = {}

    # ---------------------------------------------------------------- members and groups

    def add_member(self, action_id: int, data: list[int]) -> int:
        """Create a member; returns its handle."""
        h = self._members.get()
        self.actions[h] = (action_id, data)
        self._member_refs[h] = 0
        return h

    def modify_member(self, h: int, action_id: int, data: list[int]) -> None:
        """Give a member another action or data."""
        self._check_member(h)
        self.actions[h] = (action_id, data)

    def delete_member(self, h: int) -> None:
        """Delete a member no group and no entry uses."""
        self._check_member(h)
        if self._member_refs[h] > 0:
            raise ProfileError("MBR_STILL_USED")
        self._members.release(h)

    def create_group(self) -> int:
        """Create an empty group; returns its handle."""
        g = self._groups.get()
        self.groups[g] = []
        self._group_refs[g] = 0
        return g

    def delete_group(self, g: int) -> None:
        """Delete a group no entry uses (bmv2 allows it with members in it)."""
        self._check_group(g)
        if self._group_refs[g] > 0:
            raise ProfileError("GRP_STILL_USED")
        for h in self.groups.pop(g):
            self._member_refs[h] -= 1
        self._groups.release(g)

    def add_to_group(self, h: int, g: int) -> None:
        """Add a member to a group."""
        self._check_member(h)
        self._check_group(g)
        members = list(self.groups[g])
        if h in members:
            raise ProfileError("MBR_ALREADY_IN_GRP")
        bisect.insort(members, h)
        self.groups[g] = members
        self._member_refs[h] += 1

    def remove_from_group(self, h: int, g: int) -> None:
        """Remove a member from a group."""
        self._check_member(h)
        self._check_group(g)
        if h not in self.groups[g]:
            raise ProfileError("MBR_NOT_IN_GRP")
        self.groups[g] = [m for m in self.groups[g] if m != h]
        self._member_refs[h] -= 1

    def member_handles(self) -> list[int]:
        """Members in handle order (as bmv2 lists them)."""
        return sorted(self._members.used)

    def group_handles(self) -> list[int]:
        """Groups in handle order (as bmv2 lists them)."""
        return sorted(self._groups.used)

    def has_member(self, h: int) -> bool:
        """Whether `h` is a member handle in use."""
        return h in self._members.used

    def has_group(self, g: int) -> bool:
        """Whether `g` is a group handle in use."""
        return g in self._groups.used

    def _check_member(self, h: int) -> None:
        if h not in self._members.used:
            raise ProfileError("INVALID_MBR_HANDLE")

    def _check_group(self, g: int) -> None:
        if g not in self._groups.used:
            raise ProfileError("INVALID_GRP_HANDLE")

    # ---------------------------------------------------------------- references from table entries

    def ref(self, member: int, group: int) -> None:
        """An entry now points at `member` (or at `group` when it is >= 0)."""
        self._count(member, group, 1)

    def unref(self, member: int, group: int) -> None:
        """An entry no longer points at `member` (or `group`)."""
        self._count(member, group, -1)

    def _count(self, member: int, group: int, step: int) -> None:
        # bmv2's counts are unsigned ints: one taken below zero (see Pipeline._modify_indirect) wraps.
        refs, key = (self._group_refs, group) if group >= 0 else (self._member_refs, member)
        refs[key] = (refs[key] + step) & 0xFFFFFFFF

    # ---------------------------------------------------------------- packets

    def picker(self) -> Callable[[Any, int, int], tuple[int, list[int]]]:
        """The per-packet choice: (packet, member, group) -> (JSON action id, action data)."""
        actions, groups, selector = self.actions, self.groups, self.selector
        empty: tuple[int, list[int]] = (NO_ACTION, [])

        def pick(p: Any, member: int, group: int) -> tuple[int, list[int]]:
            if group < 0:
                return actions[member]
            members = groups.get(group)
            if not members:
                return empty
            # bmv2 without a selector hash (a table of type indirect_ws over a profile without one) uses 0.
            h = (selector(p) & HASH_MASK) if selector is not None else 0
            return actions[members[h % len(members)]]

        return pick
