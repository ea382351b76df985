"""Control loops' pure cores: role assignment and flipping (`flip`), the signals one tick sees
(`signals`), the SLO-driven autoscaler (`autoscaler`), the flip trigger (`flipper`) and
Aladdin's worker planner (`aladdin`)."""
