"""Action policies, consciousness streams and the planning prompt (issue M5)."""
