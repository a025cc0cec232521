"""The settings sections of agent memory, memory blocks and context management (`memory.*`,
`blocks.*`, `context.*`): parts of `colony.config.ColonySettings`, kept in their own module
(config.py was past 600 lines). Import them from `colony.config` like every other section."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field


class ChromaServerSettings(BaseModel):
    """The Chroma server `colony up` starts beside the embedded Redis when `memory.chroma_url` is unset."""

    enabled: bool = Field(True, description="Start a Chroma server with `colony up` (the `chroma` CLI).")
    binary: Path | None = Field(None, description="`chroma` CLI to run; default: the one beside Python.")
    host: str = "127.0.0.1"
    port: int | None = Field(None, ge=1, le=65535, description="Port to listen on; unset picks a free one.")
    start_timeout_seconds: float = Field(60.0, gt=0)


class MemorySettings(BaseModel):
    """Agent memory: where the vector index lives, the local embedder, ranking and bounds
    (docs/memory.md). Redis holds every entry; the Chroma index is derived and rebuildable."""

    chroma_url: str | None = Field(
        None,
        description="Chroma server (http://host:port) every replica uses; unset = the one `colony up` "
        "starts beside Redis, else an in-process index under data_dir (library use).",
    )
    chroma: ChromaServerSettings = Field(default_factory=ChromaServerSettings)
    collection_prefix: str = Field(
        "colony",
        pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_-]{0,40}$",
        description="Prefix of Chroma collection names.",
    )
    embedder_cache_dir: Path | None = Field(
        None, description="Where the packaged embedding model is unpacked; default data_dir/models."
    )
    # chosen on benchmarks/recall_sets/dev.jsonl at 10k entries, where 0.85/0.15 was no worse than
    # 0.7/0.3 (within the noise), never on the test sets (docs/memory.md, Benchmarks)
    vector_weight: float = Field(0.85, ge=0, le=1, description="Weight of cosine similarity in relevance.")
    keyword_weight: float = Field(0.15, ge=0, le=1, description="Weight of the BM25 keyword score.")
    recency_weight: float = Field(
        0.2, ge=0, le=1, description="How much age lowers relevance (0 = not at all)."
    )
    recency_half_life_seconds: float = Field(
        7 * 24 * 3600.0, gt=0, description="Age at which the recency factor is one half."
    )
    max_content_chars: int = Field(8000, ge=100, le=200_000, description="Longest entry text (422 above).")
    max_payload_bytes: int = Field(
        64_000,
        ge=1000,
        le=10_000_000,
        description="Largest JSON (UTF-8 bytes) of an entry's `data` and `metadata` together (422 above).",
    )
    max_tags_per_entry: int = Field(32, ge=1, le=256)
    default_max_entries: int = Field(
        10_000, ge=1, description="Cap of a scope whose capability sets no max_entries."
    )
    max_recall_results: int = Field(100, ge=1, le=1000, description="Most entries one recall returns.")
    ingest_batch: int = Field(64, ge=1, le=1000, description="Source entries ingested per transaction.")


class BlockSettings(BaseModel):
    """Memory blocks (docs/blocks.md): defaults and bounds of Loro-versioned blocks in Redis."""

    default_char_limit: int = Field(5000, ge=100, le=100_000, description="Char limit of a new block.")
    max_char_limit: int = Field(100_000, ge=1000, le=1_000_000, description="Largest char limit allowed.")
    max_blocks_per_owner: int = Field(64, ge=1, le=10_000, description="Blocks one agent may own.")
    max_shares_per_block: int = Field(256, ge=1, le=10_000, description="Agents one block is shared with.")
    compact_after_updates: int = Field(
        32, ge=1, le=10_000, description="Update-log length at which the log is folded into the snapshot."
    )
    history_versions: int = Field(
        500,
        ge=10,
        le=100_000,
        description="Versions kept viewable; older history goes into a shallow snapshot when compacting.",
    )
    log_max_entries: int = Field(200, ge=1, le=10_000, description="Default cap of a rolling log block.")
    log_shown_entries: int = Field(10, ge=1, le=1000, description="Log entries rendered into the prompt.")
    max_edit_chars: int = Field(20_000, ge=100, le=1_000_000, description="Longest text one edit may carry.")
    cached_documents: int = Field(256, ge=1, le=100_000, description="Block documents a process keeps.")


class ContextSettings(BaseModel):
    """Context management (docs/context.md): checkpoints, the action log, compaction, sessions."""

    checkpoints_kept: int = Field(
        10, ge=1, le=1000, description="Checkpoints kept per agent (one per step; the oldest go first)."
    )
    action_log_max_entries: int = Field(
        2000,
        ge=10,
        le=100_000,
        description="Recorded model and action results kept for an agent's current run (write-ahead log).",
    )
    token_budget: int = Field(
        0,
        ge=0,
        le=10_000_000,
        description="Prompt tokens an agent's planning prompt may hold; 0 = the engine's context window.",
    )
    summary_max_tokens: int = Field(
        256, ge=16, le=32_768, description="Most tokens the summariser may write (its output headroom)."
    )
    summariser_input_tokens: int = Field(
        1024,
        ge=64,
        le=1_000_000,
        description="Most tokens of history given to one summariser call (the trigger leaves room for it).",
    )
    keep_first_items: int = Field(
        2, ge=0, le=1000, description="History items kept verbatim at the start when summarising."
    )
    keep_recent_items: int = Field(
        6, ge=1, le=1000, description="History items kept verbatim at the end when summarising."
    )
    mask_output_chars: int = Field(
        2000,
        ge=100,
        le=10_000_000,
        description="Action outputs longer than this are stored aside and shown by reference.",
    )
    max_export_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, le=1024**3, description="Largest agent export document accepted."
    )
    session_max_messages: int = Field(
        10_000, ge=10, le=1_000_000, description="Messages one session's conversation tree may hold."
    )
    session_max_message_chars: int = Field(
        20_000, ge=100, le=1_000_000, description="Longest message a user may send to a session."
    )
    session_max_branches: int = Field(256, ge=1, le=10_000, description="Branches one session may hold.")
    session_reply_tokens: int = Field(
        256,
        ge=1,
        le=32_768,
        description="Most tokens a session agent's reply may take (at most half the window).",
    )
    session_memory: bool = Field(
        True,
        description="Session agents keep memory: their turns in a memory hierarchy, the user's "
        "statements about themselves in a `human` block, recall of turns that left the prompt.",
    )
    session_summary_tokens: int = Field(
        200,
        ge=16,
        le=4096,
        description="Most tokens the summary of a session's turns that left the prompt may take.",
    )
    session_summary_batch: int = Field(
        6,
        ge=1,
        le=1000,
        description="Messages that leave a session's prompt before its summary is written again.",
    )
    session_recalled: int = Field(
        3, ge=0, le=20, description="Messages of a session recalled into a turn's prompt (0: none)."
    )
    session_recall_min_relevance: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Least relevance (memory's hybrid score) of a message recalled into a turn's prompt.",
    )
    session_idle_retention_seconds: float = Field(
        7 * 24 * 3600.0,
        gt=0,
        description="A session with no turn for this long is deleted with all its keys (its agent, "
        "conversation tree and state).",
    )
