"""The broker's runtime figures as RocketMQ's GET_BROKER_RUNTIME_INFO names them (``AdminBrokerProcessor``).

``mqadmin brokerStatus`` prints every entry; ``mqadmin clusterList`` parses some: ``putTps`` and
``getTransferredTps`` ("<10 s> <1 min> <10 min>" messages per second), ``msgPutTotal*`` / ``msgGetTotal*``
(totals at the start of yesterday and today, and now), ``earliestMessageTimeStamp``, ``commitLogDiskRatio``,
``brokerVersionDesc``, ``brokerActive``, the timer figures and the thread-pool queue figures (sparkmq has no
such queues: its requests are served on the event loop, so those read 0).
"""
from __future__ import annotations

import shutil
import time
from typing import TYPE_CHECKING

from ...storage_native import StoreError
from ..common.errors import SparkMQError
from ..common.protocol import SERVER_VERSION

if TYPE_CHECKING:
    from .broker import Broker

__all__ = ["runtime_info", "VERSION_DESC"]

#: What the broker says it is: the RocketMQ release whose protocol it serves (MQVersion's name of 479).
VERSION_DESC = "V5_3_3"
#: Figures of RocketMQ's thread-pool queues (sparkmq has none: requests are served on the event loop).
_POOL_FIGURES = ("sendThreadPoolQueueSize", "pullThreadPoolQueueSize", "litePullThreadPoolQueueSize",
                 "queryThreadPoolQueueSize", "ackThreadPoolQueueSize", "EndTransactionQueueSize",
                 "sendThreadPoolQueueHeadWaitTimeMills", "pullThreadPoolQueueHeadWaitTimeMills",
                 "queryThreadPoolQueueHeadWaitTimeMills", "litePullThreadPoolQueueHeadWaitTimeMills",
                 "ackThreadPoolQueueHeadWaitTimeMills", "pageCacheLockTimeMills", "dispatchBehindBytes",
                 "remainTransientStoreBufferNumbs", "startAcceptSendRequestTimeStamp")
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def _human(size: float) -> str:
    """``MixAll.humanReadableByteCount``'s shape (binary units)."""
    unit = 0
    while size >= 1024 and unit < len(_UNITS) - 1:
        size /= 1024
        unit += 1
    return f"{size:.1f} {_UNITS[unit]}" if unit else f"{int(size)} B"


def _rates(values: tuple[float, ...]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def runtime_info(broker: Broker, started_at_ms: int | None = None) -> dict[str, str]:
    """The broker's figures by RocketMQ's names, every value a string (a ``KVTable``).

    ``started_at_ms`` is when the broker began serving (for ``bootTimestamp`` and ``runtime``).
    """
    stats = broker.metrics.stats
    put, got = stats.totals()
    (put_y, got_y), (put_t, got_t) = stats.mornings()
    put_tps, get_tps = stats.tps()
    info: dict[str, str] = {name: "0" for name in _POOL_FIGURES}
    info.update({
        "brokerVersionDesc": VERSION_DESC,
        "brokerVersion": str(SERVER_VERSION),
        "brokerActive": str(broker.running and broker.is_master).lower(),
        "msgPutTotalYesterdayMorning": str(put_y), "msgPutTotalTodayMorning": str(put_t),
        "msgPutTotalTodayNow": str(put),
        "msgGetTotalYesterdayMorning": str(got_y), "msgGetTotalTodayMorning": str(got_t),
        "msgGetTotalTodayNow": str(got),
        "putTps": _rates(put_tps), "getTransferredTps": _rates(get_tps), "getFoundTps": _rates(get_tps),
        "getTotalTps": _rates(get_tps), "getMissTps": _rates((0.0,) * len(get_tps)),
        "timerReadBehind": "0", "timerOffsetBehind": "0", "timerCongestNum": "0", "timerEnqueueTps": "0.0",
        "timerDequeueTps": "0.0",
    })
    try:
        offsets = broker.store.log_offsets()
    except SparkMQError:  # not started: no log figures
        offsets = None
    if offsets is not None:
        info["commitLogMinOffset"] = str(offsets.min_offset)
        info["commitLogMaxOffset"] = str(offsets.max_offset)
        info["remainHowManyDataToFlush"] = _human(max(offsets.max_offset - offsets.flushed_offset, 0))
        earliest = -1  # RocketMQ's answer for an empty log
        if offsets.max_offset > offsets.min_offset:
            try:
                earliest = broker.store.commit_log.store_timestamp_at(offsets.min_offset)
            except StoreError:  # retention removed it meanwhile
                earliest = -1
        info["earliestMessageTimeStamp"] = str(earliest)
    try:
        disk = shutil.disk_usage(broker.config.data_dir)
    except OSError:
        disk = None
    if disk is not None:
        info["commitLogDiskRatio"] = f"{(disk.total - disk.free) / disk.total:.4f}" if disk.total else "0.0"
        info["commitLogDirCapacity"] = f"Total : {_human(disk.total)}, Free : {_human(disk.free)}."
    if started_at_ms is not None:
        seconds = max(int(time.time() - started_at_ms / 1000), 0)
        days, rest = divmod(seconds, 86400)
        hours, rest = divmod(rest, 3600)
        minutes, seconds = divmod(rest, 60)
        info["bootTimestamp"] = str(started_at_ms)
        info["runtime"] = f"[ {days} days, {hours} hours, {minutes} minutes, {seconds} seconds ]"
    return info
