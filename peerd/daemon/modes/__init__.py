"""The learning modes, registered once (as Syncthing registers its folder types): one module
per mode, each entry of :data:`MODES` the mode's constructor.

A mode (:class:`peerd.daemon.modes.base.Mode`) owns its node state, its local step, what it
publishes, its learner file, its log line and its status block; the round around it is
:func:`peerd.daemon.modes.base.run_round`, the same for every mode. Adding a mode: a module
here with a class meeting :class:`~peerd.daemon.modes.base.Mode`, its name in
:class:`peerd.core.modes.ModeName`, one line in :data:`MODES`, its settings in the config
and its docs (docs/architecture.md, "Learning modes").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from peerd.core.modes import ModeName
from peerd.daemon.modes.base import Mode, ModeDaemon
from peerd.daemon.modes.cordial import CordialMode
from peerd.daemon.modes.knowledge import KnowledgeMode
from peerd.daemon.modes.sensors import SensorMode
from peerd.daemon.modes.weights import WeightsMode

#: Each mode's constructor, called once at start-up with the daemon.
MODES: Mapping[ModeName, Callable[[ModeDaemon], Mode]] = {
    ModeName.WEIGHTS: WeightsMode,
    ModeName.KNOWLEDGE: KnowledgeMode,
    ModeName.CORDIAL: CordialMode,
    ModeName.SENSORS: SensorMode,
}


def build_mode(name: ModeName, daemon: ModeDaemon) -> Mode:
    """The mode ``name`` of ``daemon``: its node state is the one the daemon then gossips."""
    return MODES[name](daemon)
