"""DLedger pieces in one process: the commit log as a Raft log (gate, replication, truncation, reopening),
the name servers' epoch guard, and the DLedger settings of a broker."""
from __future__ import annotations

from pathlib import Path

import pytest

from sparkmq.platform.broker.config import BrokerConfig
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.message import Message
from sparkmq.platform.ha.dledger import CommitLogRaftLog
from sparkmq.platform.ha.dledger.store_log import INDEX_FILE_NAME
from sparkmq.platform.namesrv import NameServerConfig, RouteTable
from sparkmq.platform.store import MessageStore, StoreConfig

SEG = 64 * 1024


def open_store(root: Path) -> MessageStore:
    return MessageStore(StoreConfig(root=root, segment_size=SEG, max_message_size=4096, max_properties_size=1024,
                                    background_services=False,
                                    store_host="10.0.0.1:10911")).start()


def put(store: MessageStore, body: bytes, queue_id: int = 0) -> int:
    result = store.put(Message("T", body), queue_id)
    return result.commitlog_offset + result.store_size


@pytest.fixture()
def pair(tmp_path: Path):
    """A leader's store and log, and a follower's."""
    stores = [open_store(tmp_path / name / "store") for name in ("leader", "follower")]
    logs = [CommitLogRaftLog(s, tmp_path / name / "dledger") for s, name in zip(stores, ("leader", "follower"),
                                                                                  strict=True)]
    yield stores, logs
    for log_, store in zip(logs, stores, strict=True):
        log_.close()
        store.shutdown()


def test_local_appends_pass_the_gate_only_while_leading_and_become_entries_of_the_term(pair) -> None:
    (leader, _), (log_, _) = pair
    with pytest.raises(SparkMQError) as refused:
        put(leader, b"too early")
    assert refused.value.code is ErrorCode.SERVICE_NOT_AVAILABLE
    assert leader.log_offsets().max_offset == 0 and log_.last() == (0, 0)  # refused: nothing written
    woken = []
    log_.on_local_append = lambda: woken.append(1)
    log_.set_writable(3)
    end1 = put(leader, b"one")
    end2 = leader.put_batch("T", 1, [Message("T", b"two"), Message("T", b"three")])[-1]
    end2 = end2.commitlog_offset + end2.store_size
    assert log_.last() == (end2, 3) and log_.term_at(end1) == 3 and log_.term_at(end1 - 1) is None
    assert log_.index.entries() == [(0, end1, 3), (end1, end2, 3)]
    assert len(woken) == 2
    log_.set_writable(None)
    with pytest.raises(SparkMQError):
        put(leader, b"after stepping down")
    assert log_.last() == (end2, 3)


def test_a_follower_gets_the_leaders_entries_byte_for_byte_and_cuts_a_conflicting_tail(pair) -> None:
    (leader, follower), (lead, follow) = pair
    lead.set_writable(1)
    noop = lead.append(1, b"noop-1")
    for i in range(20):
        put(leader, b"m%d" % i * 50, i % 4)
    entries = lead.entries_from(0, 1 << 20)
    assert entries[0][:2] == (0, 1) and len(entries) == 21 and noop == (0, len(entries[0][2]))
    for start, term, data in entries:
        follow.append_at(start, term, data)
    assert follow.last() == lead.last()
    assert follower.read_replication(0, lead.last()[0]) == leader.read_replication(0, lead.last()[0])
    assert follower.max_offset("T", 1) == leader.max_offset("T", 1) == 5
    # A batch limit keeps whole entries, at least one.
    assert len(lead.entries_from(0, 1)) == 1
    with pytest.raises(ValueError):
        lead.entries_from(1, 100)
    # The follower's tail past entry 10 conflicts with a new leader's log: cut it.
    cut_at = entries[10][0]
    follow.truncate(cut_at)
    assert follow.last()[0] == cut_at == follower.log_offsets().max_offset
    assert follower.max_offset("T", 1) < leader.max_offset("T", 1)
    with pytest.raises(ValueError):
        follow.append_at(cut_at + 1, 1, entries[10][2])
    for start, term, data in entries[10:]:
        follow.append_at(start, term, data)
    assert follower.read_replication(0, lead.last()[0]) == leader.read_replication(0, lead.last()[0])


def test_reopening_cuts_log_bytes_no_entry_names(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    log_ = CommitLogRaftLog(store, tmp_path / "dledger")
    log_.set_writable(2)
    end = put(store, b"indexed")
    log_.close()  # the gate is lifted: what follows is "appended, killed before its index record"
    put(store, b"never indexed")
    assert store.log_offsets().max_offset > end
    reopened = CommitLogRaftLog(store, tmp_path / "dledger")
    assert reopened.recovered_cut_bytes > 0 and store.log_offsets().max_offset == end == reopened.last()[0]
    reopened.close()
    # An index naming more than the log holds (a machine crash ate the tail) is cut back to it.
    index = tmp_path / "dledger" / INDEX_FILE_NAME
    index.write_bytes(index.read_bytes() * 2)  # a second record that does not follow the first: dropped
    again = CommitLogRaftLog(store, tmp_path / "dledger")
    assert again.last() == (end, 2) and len(again) == 1
    again.close()
    store.shutdown()


def test_a_member_refuses_a_store_written_outside_dledger(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    put(store, b"written before DLedger")
    with pytest.raises(SparkMQError) as refused:
        CommitLogRaftLog(store, tmp_path / "dledger")
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT
    store.shutdown()


def test_a_deposed_leader_cannot_take_the_master_route_back() -> None:
    table = RouteTable(NameServerConfig(broker_expiry_s=120.0), clock=lambda: 0.0)
    old, new = "127.0.0.1:20001", "127.0.0.1:20002"
    table.register_broker("C", "broker-a", 0, old, None, 1, epoch=3, now=0.0)
    table.register_broker("C", "broker-a", 0, new, None, 1, epoch=4, now=1.0)  # the new leader displaces it
    assert table.broker_data("broker-a").master_addr == new
    with pytest.raises(SparkMQError) as stale:
        table.register_broker("C", "broker-a", 0, old, None, 1, epoch=3, now=2.0)  # woke up late
    assert stale.value.code is ErrorCode.STALE_EPOCH
    assert table.broker_data("broker-a").master_addr == new
    table.register_broker("C", "broker-a", 2, old, None, 1, epoch=4, now=3.0)  # it follows now
    assert table.broker_data("broker-a").broker_addrs == {0: new, 2: old}


@pytest.mark.parametrize(("settings", "bad"), [
    ({"dledger_peers": "n0-127.0.0.1:1;n1-127.0.0.1:2"}, "at least 3"),
    ({"dledger_peers": "n0-127.0.0.1:1;n1-127.0.0.1:2;n2-127.0.0.1:3", "dledger_self_id": "n9"}, "dledger_self_id"),
    ({"dledger_peers": "n0-127.0.0.1:1;n0-127.0.0.1:2;n2-127.0.0.1:3"}, "twice"),
    ({"dledger_peers": "n0:127.0.0.1:1;n1-127.0.0.1:2;n2-127.0.0.1:3"}, "id-host:port"),
    ({"dledger_peers": "n0-127.0.0.1:1;n1-127.0.0.1:2;n2-127.0.0.1:3", "dledger_preferred_leader": "n7"},
     "preferred"),
    ({"dledger_heartbeat_ms": 0}, "dledger_heartbeat_ms"),
])
def test_dledger_settings_are_checked(settings: dict[str, object], bad: str) -> None:
    with pytest.raises(ValueError, match=bad):
        BrokerConfig(dledger_enabled=True, **{"dledger_peers": "n0-127.0.0.1:1;n1-127.0.0.1:2;n2-127.0.0.1:3",
                                              **settings})


def test_dledger_members_parse_rocketmq_peers() -> None:
    config = BrokerConfig(dledger_enabled=True, dledger_self_id="n1",
                          dledger_peers="n0-127.0.0.1:40911; n1-127.0.0.1:40912;n2-[::1]:40913")
    assert config.dledger_members() == {"n0": ("127.0.0.1", 40911), "n1": ("127.0.0.1", 40912),
                                        "n2": ("::1", 40913)}
    assert config.ha_bind_port is None  # members replicate over Raft, not the HA port
