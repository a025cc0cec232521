"""Loro-versioned memory blocks: core/working/archival/log, sharing, history (later milestone)."""
