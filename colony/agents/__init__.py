"""Agent, lifecycle, capabilities, hooks, actions, blueprints and AgentHandle (issue M2)."""
