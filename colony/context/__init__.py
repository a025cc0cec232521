"""Conversations: sessions whose messages form a tree (branches, switch, non-destructive revert,
fork) and the session agent that answers them. The rest of context management lives in the
package that owns what it changes: checkpoints and the action log in `colony.agents.state`,
compaction in `colony.planning`, export/import in `colony.system` (docs/context.md)."""
