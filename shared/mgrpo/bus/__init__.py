"""The bus: message schemas, queue topology, the Celery app factory, and the ``Bus``
interface (in-memory for embedded mode, kombu/RabbitMQ for distributed mode).

Import Celery-dependent parts from ``mgrpo.bus.app`` and RabbitMQ parts from
``mgrpo.bus.kombu_bus``; this package root stays light.
"""

from mgrpo.bus.handler import MemoryDedupe, Outcome, process_payload
from mgrpo.bus.messages import (
    EpisodeTask,
    Message,
    MessageDecodeError,
    RoundCommand,
    SubAgentCall,
    SubAgentResult,
    TrajectoryMessage,
    WeightsAnnouncement,
    decode_message,
    encode_message,
)
from mgrpo.bus.transport import Bus, DeadLetter, InMemoryBus

__all__ = [
    "Bus", "DeadLetter", "EpisodeTask", "InMemoryBus", "MemoryDedupe", "Message",
    "MessageDecodeError", "Outcome", "RoundCommand", "SubAgentCall", "SubAgentResult",
    "TrajectoryMessage", "WeightsAnnouncement", "decode_message", "encode_message",
    "process_payload",
]
