"""The Ray Serve application: engine replicas hosting agents, the control plane, the HTTP API."""
