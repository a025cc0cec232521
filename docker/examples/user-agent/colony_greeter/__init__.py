"""Example user agents for Colony (docker/README.md, User agents)."""
