"""FastAPI ingress behind Ray Serve: runs, events, agents, health (issue M4)."""
