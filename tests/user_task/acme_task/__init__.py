"""Acme's own task for mgrpo, as a user writes it: a search tool over Acme's HTTP API
(``acme_task.tools``), a lenient verifier and an r_expert judge (``acme_task.verify``), and
its questions (``data/questions.jsonl``). mgrpo never names this package: a run config finds
it through ``plugins:`` and import paths (tests/user_task/run.yaml)."""
