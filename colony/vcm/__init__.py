"""The virtual context memory: page sources, the page table in Redis, page-affinity placement."""

from colony.vcm.eviction import NeededSoon, SoonEntry
from colony.vcm.page_demand import Estimate, PageDemand
from colony.vcm.page_table import PageRecord, PageTable, SourceRecord
from colony.vcm.pages import FileSpan, PageInfo, PageSource, estimate_tokens
from colony.vcm.placement import ReplicaView, affinity, choose_replica, rank_replicas

__all__ = [
    "Estimate",
    "FileSpan",
    "NeededSoon",
    "PageDemand",
    "PageInfo",
    "PageRecord",
    "PageSource",
    "PageTable",
    "ReplicaView",
    "SoonEntry",
    "SourceRecord",
    "affinity",
    "choose_replica",
    "estimate_tokens",
    "rank_replicas",
]
