"""The broker controller: lifecycle and wiring of the topic table, store, clients, offsets, locks,
long polling, registration, and the processors that handle requests.

Requests are handled by one processor per family (:mod:`.processors`: send, pull, consumer,
admin, transaction, query); protocol adapters (HTTP in ``sparkmq.api.broker_app``, remoting)
only decode, call a processor and encode.  Every processor method validates its input first
and raises :class:`~sparkmq.platform.common.errors.SparkMQError` with a stable code, leaving
nothing changed; a send's topic is auto-created only after its message was stored.

Lifecycle: :meth:`Broker.start` loads the topic table, opens the store, restores
consumer offsets and starts the background threads (offset persist, client expiry,
name server registration, and on a master the delay-level, timer and transaction-check
services, whose due messages come back through :meth:`Broker._redeliver`).
:meth:`Broker.shutdown` stops accepting sends and pulls, releases held pulls, waits for
sends in flight, unregisters from the name servers, stops those services (persisting
their progress), persists offsets and closes the store -- in that order.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..auth.store import AclStore, acl_path
from ..common.errors import ErrorCode, SparkMQError
from ..common.failure_log import set_summary_interval
from ..common.system_topics import DLQ_PREFIX, RETRY_PREFIX
from ..ha import ReplicationMaster, ReplicationSlave
from ..ha.cluster_auth import ClusterAuth
from ..ha.dledger import DLedgerMember, RaftConfig
from ..store import AppendEvent, MessageStore
from ..store.disk import RetentionFloor
from .check_channel import CheckChannel
from .client_manager import ClientManager
from .config import BrokerConfig, BrokerRole
from .lake_index import LakeIndex
from .locks import QueueLockManager
from .long_polling import PullHoldService
from .metrics import BrokerMetrics
from .offsets import CONSUMER_OFFSETS_TABLE, ConsumerOffsetManager
from .overload import OverloadGuard
from .processors import (
    AdminProcessor,
    ConsumerProcessor,
    PullProcessor,
    QueryProcessor,
    SendProcessor,
    TransactionProcessor,
)
from .processors.pop import PopProcessor
from .registration import RegistrationService
from .schedule import ScheduleService
from .slave_sync import SlaveSynchronizer
from .subscription_groups import SubscriptionGroupManager
from .timer import TimerService
from .topics import TopicConfigManager, is_reserved_topic
from .trace import TracedTransactionService, TraceLookup, TraceRecorder
from .transaction import TransactionService

__all__ = ["Broker"]

log = logging.getLogger("sparkmq.broker")

#: How long shutdown waits for sends and reads in flight before closing the store anyway.
_DRAIN_TIMEOUT_S = 10.0


class Broker:
    """One broker: the controller the HTTP app calls (see the module docstring for the lifecycle)."""

    def __init__(self, config: BrokerConfig) -> None:
        """Build every component; nothing touches the disk or network until :meth:`start`."""
        self.config = config
        set_summary_interval(config.log_summary_interval_s)  # before the components build their FailureLogs
        self.topics = TopicConfigManager(config.topics_path, default_queue_nums=config.default_topic_queue_nums,
                                         auto_create=config.auto_create_topic)
        #: Consumer groups' settings as ``mqadmin updateSubGroup`` sets them (defaults for the others).
        self.subscription_groups = SubscriptionGroupManager(config.progress_path("subscription_groups"))
        self.store = MessageStore(config.store_config(), queue_count_of=self.topics.queue_count)
        self.clients = ClientManager(config.client_expiry_s, config.client_scan_interval_s)
        self.locks = QueueLockManager(config.queue_lock_expiry_s)
        self.offsets = ConsumerOffsetManager(config.lake_table_path(CONSUMER_OFFSETS_TABLE), config.broker_name,
                                             config.offset_persist_interval_s, config.offset_reset_fence_s)
        self.holds = PullHoldService()
        #: Fast failure under overload: SYSTEM_BUSY instead of queueing (platform/broker/overload.py).
        self.overload = OverloadGuard(send_wait_s=config.wait_time_ms_in_send_queue / 1000.0,
                                      pull_wait_s=config.wait_time_ms_in_pull_queue / 1000.0,
                                      busy_s=config.os_page_cache_busy_timeout_ms / 1000.0,
                                      max_pending_acks=config.max_pending_acks, max_held_pulls=config.max_held_pulls,
                                      on_busy=lambda reason: self.metrics.busy(reason))
        self.metrics = BrokerMetrics(self._scrape_commitlog_max, self._scrape_queue_max, self._scrape_group_lag)
        self.registration = RegistrationService(config.namesrv_addrs, self.registration_payload,
                                                self._unregister_payload, config.register_interval_s,
                                                config.register_timeout_s, on_answer=self._on_registered,
                                                tls=config.tls, credentials=config.namesrv_credentials)
        #: The cluster credential brokers prove to each other (HA, DLedger); required with ACL on.
        self.cluster_auth = ClusterAuth(config.cluster_secret,
                                        required=config.acl_enabled or config.cluster_secret is not None,
                                        clock_skew_s=config.acl_clock_skew_s)
        #: Replication: a master serves its slaves (the runner opens the HA port on its loop), a slave follows.
        self.replication_master: ReplicationMaster | None = None
        self.replication_slave: ReplicationSlave | None = None
        self.slave_sync: SlaveSynchronizer | None = None
        #: ``host:port`` of this master's HA endpoint once it listens (registered, so slaves find it).
        self.ha_addr: str | None = None
        #: A slave's master, as the name servers answered its registration: (HTTP address, HA address).
        self._learned_master: tuple[str | None, str | None] = (None, None)
        #: A DLedger member (``dledger_enabled``): built in :meth:`start` over the opened store, joined by the
        #: runner on its loop.  Its role decides this broker's: the leader is the master, the others slaves.
        self.dledger: DLedgerMember | None = None
        #: Role changes of a DLedger member are applied here, one at a time, off the loop.
        self._role_worker: concurrent.futures.ThreadPoolExecutor | None = None
        if config.dledger_enabled:
            # Followers copy the leader's topic table and consumer offsets, as slaves do.
            self.slave_sync = SlaveSynchronizer(self, config.ha_slave_sync_interval_s)
            self._role_worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"dledger-role-{self.name}")
        elif config.role is BrokerRole.SLAVE:
            self.replication_slave = ReplicationSlave(self.store, config.broker_name, config.broker_id,
                                                      self.master_ha_addr, tls=config.tls, auth=self.cluster_auth,
                                                      acl_store=AclStore(acl_path(config.data_dir)))
            self.slave_sync = SlaveSynchronizer(self, config.ha_slave_sync_interval_s)
        else:
            self.replication_master = ReplicationMaster(
                self.store, config.broker_name, sync=config.role is BrokerRole.SYNC_MASTER,
                in_sync_max_gap_bytes=config.ha_in_sync_max_gap_bytes,
                flush_slave_timeout_s=config.ha_flush_slave_timeout_ms / 1000.0, auth=self.cluster_auth,
                acl_store=AclStore(acl_path(config.data_dir)))
        self._state = "new"
        #: ``host:port`` of this broker's remoting endpoint, set by the runner once it listens (routes carry it).
        self.remoting_addr: str | None = None
        #: ``host:port`` of this broker's RocketMQ 5 gRPC endpoint, set by the runner once it listens (routes carry it).
        self.grpc_addr: str | None = None
        self._components: dict[str, tuple[Callable[[], dict[str, Any]], Callable[[], bool]]] = {}
        #: The lake's index and messages tables (written by the dispatch job), read with delta-rs.
        self.lake_index = LakeIndex(config.data_dir / "lake")
        #: Trace events into RMQ_SYS_TRACE_TOPIC (buffered, written by its own thread, stored by the send
        #: processor built below), and their lookup.
        # A slave's log is its master's, byte for byte: it writes no trace messages of its own.
        self.tracer = TraceRecorder(lambda message: self.send_processor.put_trace(message), config.broker_name,
                                    enabled=config.trace_enabled and config.role is not BrokerRole.SLAVE
                                    and not config.dledger_enabled)
        self.trace_lookup = TraceLookup(config.data_dir / "lake")
        self.add_component("trace", self.tracer.status)
        self._state_lock = threading.Lock()
        self._inflight = 0
        self._drained = threading.Condition(self._state_lock)
        self.levels_ms = config.delay_levels_ms
        #: Background services over the store; built in :meth:`start` (they read the store when built).
        self.schedule: ScheduleService | None = None
        self.timers: TimerService | None = None
        self.transactions: TransactionService | None = None
        self.checks = CheckChannel()
        # One processor per request family, each given the components it uses; protocol adapters call these.
        # The broker itself is passed as the narrow views processors read of it (BrokerState, Replication,
        # StartedServices, BrokerInfo): its role, DLedger member and services change while it runs.
        self.send_processor = SendProcessor(self, config, self.store, self.topics, self.clients, self.metrics,
                                            self.tracer, self.overload, replication=self, services=self)
        self.pull_processor = PullProcessor(self, config, self.store, self.topics, self.clients, self.offsets,
                                            self.holds, self.metrics, self.tracer, self.lake_index, self.overload)
        self.query_processor = QueryProcessor(self, self.store, self.tracer, self.lake_index, self.trace_lookup)
        #: POP consumption (RocketMQ 5 receive / ack / invisible time); its state is rebuilt in start().
        self.pop_processor = PopProcessor(self, config, self.store, self.topics, self.offsets, self.metrics,
                                          self.tracer, puller=self.pull_processor, sender=self.send_processor)
        self.consumer_processor = ConsumerProcessor(self, self.store, self.topics, self.clients, self.offsets,
                                                    self.locks, self.holds, pop_lag=self.pop_processor)
        self.admin_processor = AdminProcessor(self, self, config, self.store, self.topics, self.offsets, self.clients,
                                              sender=self.send_processor, puller=self.pull_processor,
                                              query=self.query_processor)
        self.transaction_processor = TransactionProcessor(self, config, self.store, self.clients, self.checks,
                                                          services=self, sender=self.send_processor)
        self.topics.add_listener(lambda _version: self.registration.trigger())
        self.clients.add_leave_listener(self.consumer_processor.on_clients_left)
        self.store.add_append_listener(self._on_append)
        # Disk watermarks: early deletion keeps what a group or a service has not consumed; /health is
        # "degraded" while sends are refused (DISK_FULL), /metrics exports sparkmq_disk_*.
        self.store.set_retention_floor(self._retention_floor)
        self.add_component("disk", self.store.disk_status, lambda: self.store.writable)
        # /health shows the overload state (busy answers are not a fault: the broker protects itself);
        # /metrics exports sparkmq_overload_* gauges next to the sparkmq_system_busy_total counter.
        self.add_component("overload", self._overload_status)
        self.metrics.add_component_gauges("overload", self._overload_gauges)
        self.metrics.add_component_gauges("disk", self._disk_gauges)
        if self.replication_master is not None or self.replication_slave is not None or config.dledger_enabled:
            # /health shows the replication state; a slave cut off from its master is "degraded", and
            # /metrics exports the lag (sparkmq_replication_*).
            self.add_component("replication", lambda: self.replication_status() or {}, self._replication_healthy)
            self.metrics.add_component_gauges("replication", self._replication_gauges)

    # ================================================================== lifecycle
    @property
    def name(self) -> str:
        """The broker name."""
        return self.config.broker_name

    @property
    def addr(self) -> str:
        """The address clients and name servers are told."""
        return self.config.addr

    @property
    def running(self) -> bool:
        """Whether sends and pulls are accepted."""
        return self._state == "running"

    def start(self, register: bool = True) -> Broker:
        """Load topics, open the store, restore offsets, start the background threads; returns self.

        ``register=False`` defers name server registration to :meth:`start_registration`
        (a runner calls it once its socket accepts connections, so no client is routed to
        an address that refuses them).
        """
        if self._state != "new":
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"the broker is {self._state}, it cannot start")
        if self.config.port == 0 and not self.config.advertised_addr:
            raise ValueError("port 0: bind the listening socket first and pass config.bound_to(real_port)")
        self.topics.load()
        self.subscription_groups.load()
        self.store.start()
        try:
            if self.config.dledger_enabled:
                self.dledger = self._new_dledger_member()
            loaded = self.offsets.load()
            self.offsets.start()
            self.clients.start()
            self._build_services()
            self.pop_processor.start()
        except BaseException:
            self._stop_services()
            self.offsets.stop()
            if self.dledger is not None:
                self.dledger.close()
            self.store.shutdown()
            raise
        self._state = "running"
        for service in self._services():
            service.start()
        self.tracer.start()
        if self.replication_slave is not None:
            self.replication_slave.start()
        if self.slave_sync is not None:
            self.slave_sync.start()
        if register:
            self.registration.start()
        log.info("broker %s (%s) started at %s: %d topics, %d consumer offsets, store clean start %s",
                 self.name, self.config.role, self.addr, len(self.topics), loaded, self.store.clean_start)
        return self

    def _build_services(self) -> None:
        cfg = self.config
        if cfg.role is BrokerRole.SLAVE or (self.dledger is not None and not self.dledger.leads):
            return  # a slave stores nothing of its own; its master delivers (a DLedger leader builds them)
        self.schedule = ScheduleService(self.store, self.levels_ms, cfg.progress_path("delay_offset"),
                                        self.send_processor.redeliver)
        self.timers = TimerService(self.store, cfg.progress_path("timer_progress"), self.send_processor.redeliver,
                                   max_delay_s=cfg.timer_max_delay_s)
        # Scan often enough that short test timings are honoured, at most once a second in production.
        scan = max(0.05, min(1.0, cfg.transaction_check_first_s / 4, cfg.transaction_check_interval_s / 4))
        # Traced: every settled half (commit, rollback, discard after the checks) becomes a trace event.
        traced: dict[str, Any] = {"recorder": self.tracer} if self.tracer.enabled else {}
        self.transactions = (TracedTransactionService if traced else TransactionService)(
            self.store, cfg.progress_path("transaction_progress"), self.send_processor.redeliver,
            self.transaction_processor.offer_check,
            first_check_s=cfg.transaction_check_first_s, check_interval_s=cfg.transaction_check_interval_s,
            max_checks=cfg.transaction_check_max, scan_interval_s=scan, **traced)

    def _services(self) -> list[Any]:
        return [s for s in (self.schedule, self.timers, self.transactions) if s is not None]

    def _stop_services(self) -> None:
        for service in self._services():
            try:
                service.stop()
            except Exception:  # one service failing to persist must not keep the store open
                log.exception("stopping %s failed", type(service).__name__)

    def start_registration(self) -> None:
        """Start registering with the name servers (idempotent)."""
        if self.running:
            self.registration.start()

    def begin_shutdown(self) -> None:
        """Stop accepting sends and pulls and release held pulls and change polls (non-blocking, idempotent)."""
        with self._state_lock:
            if self._state in ("stopping", "stopped"):
                return
            was_new = self._state == "new"
            self._state = "stopped" if was_new else "stopping"
        self.holds.close()
        self.clients.release_waiters()
        self.checks.close()
        self.pop_processor.release_waiters()

    def shutdown(self) -> None:
        """Stop in order: accepting, in-flight work, registration (unregister), client scan, offsets, store."""
        with self._state_lock:
            if self._state == "stopped":
                return
            started = self._state != "new"
        self.begin_shutdown()
        if not started:
            return
        with self._drained:
            if not self._drained.wait_for(lambda: self._inflight == 0, _DRAIN_TIMEOUT_S):
                log.warning("shutdown: %d operation(s) still in flight after %.0f s", self._inflight, _DRAIN_TIMEOUT_S)
        self.registration.stop(unregister=True)
        if self.slave_sync is not None:
            self.slave_sync.stop()
        if self.replication_slave is not None:
            self.replication_slave.stop()
        if self._role_worker is not None:
            self._role_worker.shutdown(wait=True)
        self._stop_services()
        self.pop_processor.stop()  # its snapshot, before the store closes
        self.pull_processor.close()
        self.tracer.stop()  # writes the events still buffered while the store is open
        self.clients.stop()
        if not self.offsets.stop():
            log.error("shutdown: the final consumer offset persist failed (see above)")
        if self.dledger is not None:
            self.dledger.close()
        self.store.shutdown()
        with self._state_lock:
            self._state = "stopped"
        log.info("broker %s stopped", self.name)

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @contextlib.contextmanager
    def operation(self) -> Iterator[None]:
        """Count a store operation in flight; SERVICE_NOT_AVAILABLE unless running."""
        with self._state_lock:
            if self._state != "running":
                raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"the broker is {self._state}")
            self._inflight += 1
        try:
            yield
        finally:
            with self._state_lock:
                self._inflight -= 1
                if self._inflight == 0:
                    self._drained.notify_all()

    def _on_append(self, event: AppendEvent) -> None:
        """What every append sets off: held pulls of the queue wake, and the trace records the store."""
        if self.dledger is None:  # in a DLedger group records become readable when committed: see _on_commit
            self.holds.notify_put(event.topic, event.queue_id)
        self.tracer.appended(event)
        if event.replicated and self.slave_sync is not None and self.topics.get(event.topic) is None:
            self.slave_sync.trigger()  # consumers of the slave need the topic's config, not in 10 s

    # ================================================================== disk
    def _retention_floor(self) -> RetentionFloor | None:
        """The oldest commit-log offset a consumer group (its committed offset) or a delay, timer or transaction
        service (its progress) has yet to read, and who; None when every one of them is at its queue's end.

        Until :meth:`start` has loaded the offsets and built the services nothing is known: everything is held.
        """
        if self._state == "new":
            return RetentionFloor(0, "the broker starting (consumer offsets not loaded yet)")
        needs = [(f"group {group}", topic, queue_id, offset)
                 for group in self.offsets.groups()
                 for topic, by_queue in self.offsets.offsets_of(group).items()
                 for queue_id, offset in by_queue.items()]
        for service in self._services():
            needs += [(type(service).__name__, topic, queue_id, offset)
                      for topic, queue_id, offset in service.needed_offsets()]
        store = self.store
        floor: RetentionFloor | None = None
        for holder, topic, queue_id, offset in needs:
            if offset >= store.max_offset(topic, queue_id):
                continue  # caught up: it needs nothing stored yet
            offset = max(offset, store.min_offset(topic, queue_id))
            try:
                clog_offset = store.queue_unit(topic, queue_id, offset)[0]
            except SparkMQError:
                continue  # retention or a topic deletion moved the queue meanwhile
            if floor is None or clog_offset < floor.offset:
                floor = RetentionFloor(clog_offset, f"{holder} on {topic}/{queue_id} at offset {offset}")
        return floor

    def disk_status(self) -> dict[str, Any]:
        """The store's file system and watermarks as last measured (``MessageStore.disk_status``)."""
        return self.store.disk_status()

    def _disk_gauges(self) -> Iterator[tuple[str, dict[str, float]]]:
        status = self.disk_status()
        if "used_ratio" in status:
            yield self.name, {"used_ratio": status["used_ratio"], "total_bytes": status["total_bytes"],
                              "free_bytes": status["free_bytes"], "writable": float(status["writable"]),
                              "refused_writes": status["refused_writes"], "warning_ratio": status["warning_ratio"]}

    # ================================================================== DLedger
    def _new_dledger_member(self) -> DLedgerMember:
        cfg = self.config
        raft = RaftConfig(heartbeat_interval_s=cfg.dledger_heartbeat_ms / 1000.0,
                          max_missed_heartbeats=cfg.dledger_max_missed_heartbeats,
                          wait_for_ack_s=cfg.dledger_wait_for_ack_ms / 1000.0,
                          preferred_leader=cfg.dledger_preferred_leader)
        member = DLedgerMember(self.store, cfg.data_dir / "dledger", group=cfg.dledger_group or cfg.broker_name,
                               self_id=cfg.dledger_self_id, members=cfg.dledger_members(), config=raft,
                               host=cfg.host, tls=cfg.tls, auth=self.cluster_auth)
        member.replicate_acl(AclStore(acl_path(cfg.data_dir)))  # with a cluster secret: the leader's ACL
        member.add_role_listener(self._on_dledger_role)
        member.add_commit_listener(self._on_commit)
        return member

    @property
    def broker_id(self) -> int:
        """0 on a master; a slave's id (a DLedger member's changes with its role)."""
        if self.dledger is not None:
            return 0 if self.dledger.leads else self.dledger.follower_id()
        return self.config.broker_id

    @property
    def is_master(self) -> bool:
        """Whether this broker takes sends (a master, or the leader of its DLedger group)."""
        if self.dledger is not None:
            return self.dledger.leads
        return self.config.role is not BrokerRole.SLAVE

    def _on_commit(self, previous: int, commit: int) -> None:
        """A DLedger commit made records readable: wake the held pulls of the queues it covered; a follower
        that meets a topic it does not know yet copies the leader's topics now (its consumers need them)."""
        unknown = False
        for topic, queue_id in self.store.queues_in_range(previous, commit):
            self.holds.notify_put(topic, queue_id)
            unknown = unknown or self.topics.get(topic) is None
        if unknown and self.slave_sync is not None and not self.is_master:
            self.slave_sync.trigger()

    def _on_dledger_role(self, leads: bool, term: int, leader_id: str | None) -> None:
        """On the loop: the member's role changed; apply it off the loop (services start and stop slowly)."""
        if leads:
            self._learned_master = (None, None)  # a leader copies nothing from anyone
        if self._role_worker is not None:
            with contextlib.suppress(RuntimeError):  # shutting down
                self._role_worker.submit(self._apply_dledger_role, leads)

    def _apply_dledger_role(self, leads: bool) -> None:
        if not self.running or self.dledger is None or leads != self.dledger.leads:
            return  # stale: a later change is queued behind this one
        if leads:
            self._adopt_logged_topics()
        if leads and not self._services():
            self._build_services()
            for service in self._services():
                service.start()
        elif not leads and self._services():
            self._stop_services()
            self.schedule = self.timers = self.transactions = None
        log.info("broker %s: DLedger %s in term %d", self.name, "leader" if leads else "follower", self.dledger.term)
        self.registration.trigger()  # the name servers learn the new master (or that this one is not) now

    def _adopt_logged_topics(self) -> None:
        """A new DLedger leader: every topic its log holds messages of is in its topic table, so it registers them.

        Followers copy the leader's table every ``ha_slave_sync_interval_s`` (and at once for a topic they see
        first in a replicated record), but a topic the old leader auto-created just before it died may not
        have arrived: without this its route would vanish with the old leader.
        """
        queue_counts: dict[str, int] = {}
        for topic, queue_id in self.store.queues():
            queue_counts[topic] = max(queue_counts.get(topic, 0), queue_id + 1)
        for topic, count in queue_counts.items():
            if self.topics.get(topic) is not None:
                continue
            if is_reserved_topic(topic):
                if topic.startswith((RETRY_PREFIX, DLQ_PREFIX)):
                    self.topics.ensure_system_topic(topic, count)
                continue
            queues = max(count, self.config.default_topic_queue_nums)
            self.topics.create_or_update(topic, queues, queues)
            log.info("broker %s: topic %s found in the log, created with %d queues", self.name, topic, queues)

    # ================================================================== replication
    def master_ha_addr(self) -> str | None:
        """A slave's master HA endpoint: configured, else what the name servers answered (asked again now
        while they named none: the master may have registered after this slave did)."""
        addr = self.config.ha_master_addr or self._learned_master[1]
        if addr is None and self.running:
            self.registration.trigger()
        return addr

    def master_addr(self) -> str | None:
        """A slave's master (HTTP address), as the name servers answered; None on a master or before."""
        return self._learned_master[0]

    def _on_registered(self, answer: dict[str, Any]) -> None:
        if not self.is_master:
            master, master_ha = answer.get("master_addr"), answer.get("master_ha_addr")
            if isinstance(master, str) or master is None:
                self._learned_master = (master, master_ha if isinstance(master_ha, str) else None)

    def _replication_healthy(self) -> bool:
        if self.dledger is not None:  # a group without a leader takes no sends
            return not self.running or self.dledger.leader_id is not None
        slave = self.replication_slave
        return slave is None or not self.running or slave.connected

    def _replication_gauges(self) -> Iterator[tuple[str, dict[str, float]]]:
        status = self.replication_status() or {}
        if self.dledger is not None:
            yield self.name, {"leader": float(self.dledger.leads), "term": float(status.get("term", 0)),
                              "commit_offset": float(status.get("commit_offset", 0)),
                              "waiting_sends": float(status.get("waiting_sends", 0))}
        elif self.replication_master is not None:
            yield self.name, {"in_sync_slaves": float(status.get("in_sync_slaves", 0)),
                              "max_bytes_behind": float(status.get("max_bytes_behind") or 0),
                              "waiting_sends": float(status.get("waiting_sends", 0))}
        elif status:
            yield self.name, {"connected": float(bool(status.get("connected"))),
                              "bytes_behind": float(status.get("bytes_behind") or 0),
                              "bytes_received": float(status.get("bytes_received", 0))}

    def replication_snapshot(self) -> dict[str, Any]:
        """What a slave copies from this master besides the log: the topic table and every consumer offset."""
        _, topics = self.topics.snapshot()
        offsets = {group: {topic: {str(q): o for q, o in by_queue.items()}
                           for topic, by_queue in self.offsets.offsets_of(group).items()}
                   for group in self.offsets.groups()}
        return {"topics": {name: cfg.to_dict() for name, cfg in topics.items()}, "offsets": offsets}

    def replication_status(self) -> dict[str, Any] | None:
        """The replication state (master: its slaves; slave: its master), None when neither runs."""
        if self.replication_master is not None:
            return self.replication_master.status()
        if self.replication_slave is not None:
            return self.replication_slave.status()
        if self.dledger is not None:
            return self.dledger.status()
        return None

    # ================================================================== registration
    def registration_payload(self) -> dict[str, Any]:
        """The ``POST /brokers/register`` body: identity, data version and the whole topic table."""
        version, topics = self.topics.snapshot()
        payload = {"cluster": self.config.cluster, "broker_name": self.name, "broker_id": self.broker_id,
                   "broker_addr": self.addr, "ha_addr": self.ha_addr, "remoting_addr": self.remoting_addr,
                   "grpc_addr": self.grpc_addr, "data_version": version,
                   "topic_configs": {t: cfg.to_route_dict() for t, cfg in topics.items()}}
        if self.dledger is not None:
            # The name servers keep the master of the highest term: a deposed leader that wakes up late
            # cannot take the route back.
            payload["epoch"] = self.dledger.term
        return payload

    def _unregister_payload(self) -> dict[str, Any]:
        return {"cluster": self.config.cluster, "broker_name": self.name, "broker_id": self.broker_id,
                "broker_addr": self.addr}

    def add_component(self, name: str, status: Callable[[], dict[str, Any]],
                      healthy: Callable[[], bool] | None = None) -> None:
        """Report an attached component (e.g. the lake's Spark jobs) in ``/health`` under ``name``.

        ``status()`` is shown as is; ``healthy()`` (default: always) makes the broker "degraded"
        when False.  Delivery never depends on such a component: Spark derives tables, it is never on a message's path.
        """
        self._components[name] = (status, healthy or (lambda: True))

    def health(self) -> dict[str, Any]:
        """``{"status": "ok"|"degraded", ...}`` with the state of each component."""
        store_ok = self.running and self.store.is_open
        persist_error = self.offsets.last_persist_error
        namesrvs = {addr: s.to_dict() for addr, s in self.registration.status().items()}
        # Before the first registration round finishes a name server counts as healthy.
        registration_ok = all(s["ok"] or (s["registrations"] == 0 and s["failures"] == 0) for s in namesrvs.values())
        components = {}
        for name, (status, healthy) in self._components.items():
            try:
                components[name] = {**status(), "ok": bool(healthy())}
            except Exception as exc:  # a component's report must not break /health
                components[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        ok = store_ok and persist_error is None and registration_ok and all(c["ok"] for c in components.values())
        return {"status": "ok" if ok else "degraded", "state": self._state, **components,
                "store": {"ok": store_ok, "clean_start": self.store.clean_start},
                "offsets": {"ok": persist_error is None, "pending": self.offsets.dirty_count(),
                            "last_error": None if persist_error is None else str(persist_error)},
                "namesrv": namesrvs, "held_pulls": self.holds.held()}

    def _overload_status(self) -> dict[str, Any]:
        return {**self.overload.status(), "held_pulls": self.holds.held()}

    def _overload_gauges(self) -> list[tuple[str, dict[str, float]]]:
        guard = self.overload
        return [(self.name, {"pending_acks": guard.pending_acks, "held_pulls": self.holds.held(),
                             "page_cache_busy": float(guard.page_cache_busy)})]

    def metrics_text(self) -> bytes:
        """The Prometheus text exposition."""
        return self.metrics.render()

    def _scrape_commitlog_max(self) -> int:
        try:
            return self.store.log_offsets().max_offset
        except SparkMQError:
            return 0

    def _scrape_queue_max(self) -> Iterator[tuple[str, int, int]]:
        try:
            refs = self.store.queues()
        except SparkMQError:
            return
        for topic, queue_id in refs:
            if self.topics.get(topic) is not None:
                yield topic, queue_id, self.store.max_offset(topic, queue_id)

    def _scrape_group_lag(self) -> Iterator[tuple[str, str, int]]:
        if not self.running:
            return
        for group in self.offsets.groups():
            for topic in self.offsets.topics_of(group):
                with contextlib.suppress(SparkMQError):
                    yield group, topic, self.consumer_processor.lag(group, topic)["total_lag"]
