"""The interfaces exogym grew out of, over exogym's machinery: ``DilocoSimulator`` (diloco-sim,
:mod:`exogym.compat.diloco_sim`) and EXO Gym's API (:mod:`exogym.compat.exo_gym`). Names are
imported on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from exogym.compat.diloco_sim import DilocoSimulator

__all__ = ["DilocoSimulator"]


def __getattr__(name: str) -> Any:
    if name == "DilocoSimulator":
        from exogym.compat.diloco_sim import DilocoSimulator

        return DilocoSimulator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
