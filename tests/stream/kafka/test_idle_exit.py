"""When may an idle member of a consumer group take its assignment as its share of the topic?"""

import time

from kafka import TopicPartition

from sketchrec.stream.kafka.idle import GROUP_SETTLE, IdleShare


class _Consumer:
    def __init__(self, held: set[int], partitions: set[int]):
        self.held, self.partitions = held, partitions

    def assignment(self) -> set:
        return {TopicPartition("t", p) for p in self.held}

    def partitions_for_topic(self, topic: str) -> set[int]:
        return self.partitions


def _share(group, held, assigned_ago: float) -> IdleShare:
    share = IdleShare(_Consumer(held, {0, 1, 2, 3}), "t", group)
    share.assigned()
    share.assigned_at -= assigned_ago
    return share


def test_part_of_the_topic_is_a_share_only_once_held_past_a_session():
    # a member killed while it joined holds the rest until the group evicts it (one session)
    assert not _share("g", {0, 1}, assigned_ago=1.0).settled()
    assert _share("g", {0, 1}, assigned_ago=GROUP_SETTLE + 0.5).settled()


def test_the_whole_topic_is_a_share_at_once_and_without_a_group_always():
    assert _share("g", {0, 1, 2, 3}, assigned_ago=0.0).settled()
    assert _share(None, {0}, assigned_ago=0.0).settled()


def test_never_while_the_group_rebalances_and_again_once_assigned():
    share = _share("g", {0, 1, 2, 3}, assigned_ago=GROUP_SETTLE + 5)
    share.revoked()
    assert not share.settled()
    share.assigned()
    assert share.settled()


def test_a_member_joining_is_not_settled_and_one_handed_no_partition_is_after_a_session():
    share = IdleShare(_Consumer(set(), {0, 1}), "t", "g")
    assert share.joining() and not share.settled()   # never handed a share yet
    share.assigned()   # more members than partitions: none for this one
    assert not share.joining() and not share.settled()
    share.assigned_at -= GROUP_SETTLE + 0.5
    assert share.settled() and share.drained()   # nothing to read: an idle run may end
