"""Experiments on top of the training loop: the embedded demo (``mgrpo demo``), the
ablations (``mgrpo ablate``: single-agent vs main-only vs co-training, and a turn team's
arms), ``mgrpo compare``, run plots (``mgrpo plot``), SFT transcripts from a teacher
(``mgrpo data transcripts``), the tiny warm-started assets of the tests and benchmarks, and
the demo and team ablation config files (:mod:`mgrpo.experiments.config_files`).

They import :mod:`mgrpo.training` and run it; the training loop and the services never import
them (tests/unit/test_import_contracts.py, tests/unit/test_service_imports.py).
"""
