"""PI's action profile manager (PI proto/frontend/src/action_prof_mgr.cpp) over one bmv2 action profile.

P4Runtime names members and groups by ids the controller picks, bmv2 by handles it hands out; PI keeps
the mapping. bmv2 has no member weights, so PI makes copies: a member used with weight w gets w bmv2
members with the same action (as many as its heaviest use needs; the others are deleted when no group
needs them any more), and a group holds w of them. A group is chosen from in handle order, so where a
weighted member's copies land depends on when they were made, and a wildcard read of members lists
every copy. simple_switch_grpc takes PI's individual-adds-and-removes path (its PI target does not set
a group's members at once), which this follows step by step.

A profile is programmed either with members and groups or with one-shot action sets in table entries;
PI refuses to mix the two while the profile holds anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from ..errors import P4RuntimeError
from ..profiles import ActionProfile, ProfileError

MANUAL, ONESHOT = "manual", "oneshot"


@dataclass
class Member:
    """A member as PI keeps it: its action, the bmv2 handles of its copies and how often each weight is used."""

    action_id: int
    data: list[int]
    handles: list[int]
    # weight -> number of uses; the member itself counts as one use of weight 1 while it exists.
    weight_counts: dict[int, int] = field(default_factory=lambda: {1: 1})


@dataclass
class Group:
    """A group as PI keeps it: its bmv2 handle, the max_size the controller gave, member id -> weight."""

    handle: int
    max_size: int
    weights: dict[int, int] = field(default_factory=dict)


def _error(code: grpc.StatusCode, message: str) -> P4RuntimeError:
    return P4RuntimeError(code, message)


class ProfileManager:
    """PI's ActionProfMgr for one action profile; `max_group_size` comes from the P4Info (0: none)."""

    def __init__(self, profile: ActionProfile, max_group_size: int) -> None:
        self.profile = profile
        self.max_group_size = max_group_size
        self.mode = ""
        self.members: dict[int, Member] = {}
        self.member_of: dict[int, int] = {}  # bmv2 member handle -> member id
        self.groups: dict[int, Group] = {}
        self.group_of: dict[int, int] = {}  # bmv2 group handle -> group id
        self.oneshot: dict[int, list[int]] = {}  # one-shot group handle -> its member handles

    def use(self, mode: str) -> None:
        """Enter a programming mode (MANUAL or ONESHOT), as PI's check_selector_usage does."""
        if self.mode == mode:
            return
        if self.mode and (self.members or self.groups or self.oneshot):
            raise _error(grpc.StatusCode.INVALID_ARGUMENT, "Invalid attempt to mix action selector programming modes")
        self.mode = mode

    # ---------------------------------------------------------------- members

    def member_insert(self, member_id: int, action_id: int, data: list[int]) -> None:
        """INSERT an ActionProfileMember (its action already validated)."""
        if member_id in self.members:
            raise _error(grpc.StatusCode.ALREADY_EXISTS, f"Duplicate member id: {member_id}")
        h = self.profile.add_member(action_id, data)
        self.members[member_id] = Member(action_id, data, [h])
        self.member_of[h] = member_id

    def member_modify(self, member_id: int, action_id: int, data: list[int]) -> None:
        """MODIFY an ActionProfileMember: every copy gets the new action."""
        m = self._member(member_id)
        for h in m.handles:
            self.profile.modify_member(h, action_id, data)
        m.action_id, m.data = action_id, data

    def member_delete(self, member_id: int) -> None:
        """DELETE an ActionProfileMember; bmv2 refuses while a group or a table entry uses it."""
        m = self._member(member_id)
        for h in list(m.handles):
            try:
                self.profile.delete_member(h)
            except ProfileError:
                raise _error(grpc.StatusCode.UNKNOWN, "Error when deleting member on target") from None
            del self.member_of[h]
        del self.members[member_id]

    def _member(self, member_id: int) -> Member:
        m = self.members.get(member_id)
        if m is None:
            raise _error(grpc.StatusCode.NOT_FOUND, f"Member id does not exist: {member_id}")
        return m

    # ---------------------------------------------------------------- groups

    def group_insert(self, group_id: int, max_size: int, wanted: list[tuple[int, int]]) -> None:
        """INSERT an ActionProfileGroup of (member id, weight). Like PI, the group is created before its
        members are checked, so it stays (empty) when they are refused."""
        if max_size < 0:
            raise _error(grpc.StatusCode.INVALID_ARGUMENT, "Group max_size cannot be less than 0")
        if self.max_group_size > 0 and max_size > self.max_group_size:
            raise _error(
                grpc.StatusCode.INVALID_ARGUMENT, "Group max_size cannot exceed static max_group_size (from P4Info)"
            )
        if group_id in self.groups:
            raise _error(grpc.StatusCode.ALREADY_EXISTS, f"Duplicate group id: {group_id}")
        g = self.profile.create_group()
        self.groups[group_id] = Group(g, max_size)
        self.group_of[g] = group_id
        self._set_members(group_id, wanted)

    def group_modify(self, group_id: int, max_size: int, wanted: list[tuple[int, int]]) -> None:
        """MODIFY an ActionProfileGroup: its members become `wanted`."""
        group = self._group(group_id)
        if max_size != 0 and max_size != group.max_size:
            raise _error(grpc.StatusCode.INVALID_ARGUMENT, "Cannot change group max_size after group creation")
        self._set_members(group_id, wanted)

    def group_delete(self, group_id: int) -> None:
        """DELETE an ActionProfileGroup; bmv2 refuses while a table entry uses it."""
        group = self._group(group_id)
        try:
            self.profile.delete_group(group.handle)
        except ProfileError:
            raise _error(grpc.StatusCode.UNKNOWN, "Error when deleting group on target") from None
        for member_id, weight in group.weights.items():
            m = self.members[member_id]
            m.weight_counts[weight] -= 1
            self._purge(m)
        del self.groups[group_id]
        del self.group_of[group.handle]

    def _group(self, group_id: int) -> Group:
        group = self.groups.get(group_id)
        if group is None:
            raise _error(grpc.StatusCode.NOT_FOUND, f"Group id does not exist: {group_id}")
        return group

    def _set_members(self, group_id: int, wanted: list[tuple[int, int]]) -> None:
        # PI's group_update_members with individual adds and removes, member by member in id order.
        total = 0
        for _, weight in wanted:
            if weight <= 0:
                raise _error(grpc.StatusCode.INVALID_ARGUMENT, "Member weight must be a positive integer value")
            total += weight
        group = self.groups[group_id]
        cap = group.max_size or self.max_group_size
        if cap > 0 and total > cap:
            raise _error(grpc.StatusCode.RESOURCE_EXHAUSTED, "Sum of member weights exceeds maximum group size")
        new: dict[int, int] = {}
        for member_id, weight in wanted:
            if member_id not in self.members:
                raise _error(grpc.StatusCode.NOT_FOUND, f"Member id does not exist: {member_id}")
            if member_id in new:
                raise _error(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"Duplicate member id {member_id} for group {group_id}, use weights instead",
                )
            new[member_id] = weight
        changed = sorted(set(group.weights) | set(new))
        for member_id in changed:
            self._reweigh(group.handle, self.members[member_id], group.weights.get(member_id, 0), new.get(member_id, 0))
        group.weights = new
        for member_id in changed:
            self._purge(self.members[member_id])

    def _reweigh(self, g: int, m: Member, current: int, new: int) -> None:
        member_id = self.member_of[m.handles[0]]
        while len(m.handles) < new:  # copies for the weight, made as PI makes them: one bmv2 member each
            h = self.profile.add_member(m.action_id, m.data)
            m.handles.append(h)
            self.member_of[h] = member_id
        if current > 0:
            m.weight_counts[current] -= 1
        for i in range(current - 1, new - 1, -1):
            self.profile.remove_from_group(m.handles[i], g)
        for i in range(current, new):
            self.profile.add_to_group(m.handles[i], g)
        if new > 0:
            m.weight_counts[new] = m.weight_counts.get(new, 0) + 1

    def _purge(self, m: Member) -> None:
        # Keep as many copies as the heaviest remaining use needs (at least the member itself).
        top = max(w for w, n in m.weight_counts.items() if n)
        for w in [w for w in m.weight_counts if w > top]:
            del m.weight_counts[w]
        while len(m.handles) > top:
            h = m.handles.pop()
            self.profile.delete_member(h)
            del self.member_of[h]

    # ---------------------------------------------------------------- reads and table entries

    def read_members(self, member_id: int) -> list[tuple[int, int, list[int]]]:
        """(member id, JSON action id, data) of one member (none if unknown) or, for id 0, of every bmv2
        member in handle order: a weighted member's copies each appear, as PI reads them."""
        if member_id:
            m = self.members.get(member_id)
            return [] if m is None else [(member_id, m.action_id, m.data)]
        return [(self.member_of[h], *self.profile.actions[h]) for h in self.profile.member_handles()]

    def read_groups(self, group_id: int) -> list[tuple[int, int, list[tuple[int, int]]]]:
        """(group id, max_size, [(member id, weight)] by member id) of one group or, for id 0, all in handle order."""
        if group_id:
            group = self.groups.get(group_id)
            handles = [] if group is None else [group.handle]
        else:
            handles = self.profile.group_handles()
        out = []
        for g in handles:
            weights: dict[int, int] = {}
            for h in self.profile.groups[g]:  # PI counts the copies bmv2 holds
                member_id = self.member_of[h]
                weights[member_id] = weights.get(member_id, 0) + 1
            gid = self.group_of[g]
            out.append((gid, self.groups[gid].max_size, sorted(weights.items())))
        return out

    def handle(self, member_id: int | None, group_id: int | None) -> tuple[int, int]:
        """The (member handle, group handle) a table entry naming a member or a group points at (-1: none)."""
        self.use(MANUAL)
        if member_id is not None and member_id in self.members:
            return self.members[member_id].handles[0], -1
        if group_id is not None and group_id in self.groups:
            return -1, self.groups[group_id].handle
        raise _error(grpc.StatusCode.INVALID_ARGUMENT, "Invalid member / group id")

    def names(self, member: int, group: int) -> bool:
        """Whether PI can name what an entry points at (after bmv2's reference slip it may be gone)."""
        if group >= 0:
            return group in self.group_of or group in self.oneshot
        return member in self.member_of

    def oneshot_create(self, actions: list[tuple[int, list[int], int]]) -> int:
        """A one-shot group of (JSON action id, data, weight): weight copies of each action; its handle."""
        total = 0
        for _, _, weight in actions:
            if weight <= 0:
                raise _error(grpc.StatusCode.INVALID_ARGUMENT, "Member weight must be a positive integer value")
            total += weight
        if self.max_group_size > 0 and total > self.max_group_size:
            raise _error(
                grpc.StatusCode.RESOURCE_EXHAUSTED, "Sum of weights exceeds static max_group_size (from P4Info)"
            )
        handles = [self.profile.add_member(aid, data) for aid, data, weight in actions for _ in range(weight)]
        g = self.profile.create_group()
        for h in handles:
            self.profile.add_to_group(h, g)
        self.oneshot[g] = handles
        return g

    def oneshot_delete(self, g: int) -> None:
        """Delete a one-shot group (no entry uses it any more) and its members."""
        self.profile.delete_group(g)
        for h in self.oneshot.pop(g):
            self.profile.delete_member(h)
