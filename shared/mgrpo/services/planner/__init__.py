"""The planner worker: plays each episode task's planner turns and delegates to the sub-agent
workers (:mod:`mgrpo.services.planner.worker`)."""
