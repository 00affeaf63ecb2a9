"""The lifecycle controller: turns a tool-wait forecast into store actions over time.

No engine imports, no torch, no store internals: the store is driven through
the ``BlockStore`` protocol only.  See :mod:`.controller`.
"""
from .clock import Clock, ManualClock, MonotonicClock, ScaledClock
from .controller import LifecycleController
from .device import DeviceHooks, LeaseEnd
from .registry import Event, Plan, Trajectory
from .schedules import DeviceSchedule, ForecastSchedule, LeaseOutcome, Schedule, TTLSchedule
from .core import ControllerCore
from .timer import LifecycleTimer

__all__ = ["Clock", "ManualClock", "MonotonicClock", "ScaledClock", "LifecycleController", "DeviceHooks", "LeaseEnd", "Event",
           "Plan", "Trajectory", "ControllerCore", "DeviceSchedule", "ForecastSchedule", "LeaseOutcome", "Schedule", "TTLSchedule",
           "LifecycleTimer"]
