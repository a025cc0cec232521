"""Context management: per-agent checkpoints and undo, a write-ahead action log (resume re-runs
only the unfinished action), compaction under a token budget, export/import, and sessions with a
conversation tree (docs/context.md)."""
