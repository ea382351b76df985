"""Control loops' pure cores: role assignment and flipping (autoscaler and planner to come)."""
