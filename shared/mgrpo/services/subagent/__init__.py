"""The sub-agent worker: plays one tool sub-agent's calls and replies to the planner
(:mod:`mgrpo.services.subagent.worker`)."""
