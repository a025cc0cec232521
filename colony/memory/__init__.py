"""Memory hierarchy, MemoryCapability and Loro-versioned memory blocks (later milestone)."""
