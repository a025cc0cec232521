"""An agent's durable state, with one owner: the persisted record and context (persistence), the
write-ahead action log and the checkpoint ring. Policies over that state (compaction, sessions,
export/import) live above, in planning, context and system, and import this package, never the
reverse."""
