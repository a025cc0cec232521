"""Colony: a distributed multi-agent service cluster on Ray Serve.

Agents reason over contexts far larger than one model's window; a Redis blackboard is the
single source of truth for their state, requests, results and events.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("colony")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+local"

__all__ = ["__version__"]
