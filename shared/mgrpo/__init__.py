"""mgrpo: train vertical multi-agent LLM systems with M-GRPO and AT-GRPO.

Subpackages: ``algo`` (pure math), ``envs`` (benchmark, protocol, rewards), ``tools``,
``sandbox``, ``models``, ``engines``, ``store`` (SQLAlchemy + Alembic), ``bus`` (Celery,
message schemas), ``training`` (episodes, rounds, the embedded loop), ``services``
(planner/sub-agent/trainer shells), ``cli``.
"""

__version__ = "0.1.0"
