"""AgentSystemDeployment: registry, placement, suspension and the resource monitor (issue M4/M6)."""
