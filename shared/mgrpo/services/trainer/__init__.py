"""One model's trainer: the service (:mod:`.service`), its ingestion (:mod:`.ingest`), when a
round is ready (:mod:`.readiness`), one round (:mod:`.round_training`), a run's weights and
checkpoints (:mod:`.weights`), its lease (:mod:`.lease`) and a torchrun job's ranks
(:mod:`.ranks`)."""
