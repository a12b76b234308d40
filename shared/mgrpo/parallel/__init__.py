"""Data parallelism for a trainer (torchtitan's shape): how a model is split over ranks
(:mod:`~mgrpo.parallel.sharding`: FSDP2 or DDP), the one checkpoint format and its one loader
(:mod:`~mgrpo.parallel.checkpoint`: the Hugging Face folder plus DCP optimizer shards vouched
for by a digest; :mod:`~mgrpo.parallel.optimizer_state`: one process's ``.optimizer.pt``, read
by the same loader) and the rank protocol of a torchrun job (:mod:`~mgrpo.parallel.ranks`).
World size 1 loads and saves through the same format.

This room sits above ``models`` and below ``training`` and ``services``: it imports neither
(what a rank does with its model is handed to it, :class:`~mgrpo.parallel.ranks.RankWork`).
"""
