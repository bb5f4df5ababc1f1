"""The interfaces exogym grew out of, over exogym's machinery: ``DilocoSimulator`` (diloco-sim)."""

from exogym.compat.diloco_sim import DilocoSimulator

__all__ = ["DilocoSimulator"]
