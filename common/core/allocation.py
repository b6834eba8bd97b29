"""How the members of a consumer group share its queues: the one rule the client
(``common/client/group_consumer.py``) and the broker (``common/broker/consumer_groups.py``,
which fences a commit from a member that does not own the queue) must both compute alike."""

from __future__ import annotations


def allocate_averagely(queues: list[tuple[str, int]], members: list[str],
                       me: str) -> list[tuple[str, int]]:
    """RocketMQ's AllocateMessageQueueAveragely: ``queues`` and ``members`` sorted, each
    member gets a contiguous run, the first ``len(queues) % len(members)`` one more."""
    if me not in members or not queues:
        return []
    index, n = members.index(me), len(members)
    per, extra = divmod(len(queues), n)
    start = index * per + min(index, extra)
    return queues[start : start + per + (1 if index < extra else 0)]
