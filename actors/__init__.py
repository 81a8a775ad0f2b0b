"""Ray-side pieces of rayprof: the control actor and the agent inside training workers."""
