"""Checkpoint/undo, compaction, resume and conversation-tree revert (later milestone)."""
