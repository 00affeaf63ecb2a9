"""Baseline wait predictors (point forecasts), same API as ToolWaitPredictor.

Both are owned by one caller (not thread-safe) and satisfy
:class:`kvtier.tiering.forecasting.forecast.Predictor`.
"""
from __future__ import annotations

import bisect
from typing import Mapping

from kvtier.tiering.model.decision import Forecast
from kvtier.tiering.forecasting.features import check_tool, check_wait
from kvtier.tiering.forecasting.forecast import _Q_KEYS


def _point_forecast(tool: str, value: float, n: int, source: str) -> Forecast:
    return Forecast(tool=tool, n=n, mean_s=value, quantiles={k: value for k in _Q_KEYS}, source=source)


class RunningMeanPredictor:
    """Continuum's predictor: the running mean of each tool's waits (a point forecast).

    Unknown tools get the running mean over all tools, or the TraceLab mean
    (18.4 s) before anything was observed.  Same API as ToolWaitPredictor.
    """

    PRIOR_MEAN_S = 18.4

    def __init__(self) -> None:
        self._sum: dict[str, float] = {}
        self._n: dict[str, int] = {}
        self._gsum = 0.0
        self._gn = 0

    def observe(self, tool: str, seconds: float, features: Mapping[str, str] | None = None) -> None:
        check_tool(tool)
        s = check_wait(seconds)
        self._sum[tool] = self._sum.get(tool, 0.0) + s
        self._n[tool] = self._n.get(tool, 0) + 1
        self._gsum += s
        self._gn += 1

    def forecast(self, tool: str, features: Mapping[str, str] | None = None) -> Forecast:
        check_tool(tool)
        n = self._n.get(tool, 0)
        if n:
            return _point_forecast(tool, self._sum[tool] / n, n, "tool")
        if self._gn:
            return _point_forecast(tool, self._gsum / self._gn, self._gn, "global")
        return _point_forecast(tool, self.PRIOR_MEAN_S, 0, "prior")


class GlobalMedianPredictor:
    """The median of every wait seen so far, whatever the tool (a point forecast)."""

    PRIOR_MEDIAN_S = 0.3

    def __init__(self) -> None:
        self._sorted: list[float] = []

    def observe(self, tool: str, seconds: float, features: Mapping[str, str] | None = None) -> None:
        check_tool(tool)
        bisect.insort(self._sorted, check_wait(seconds))

    def forecast(self, tool: str, features: Mapping[str, str] | None = None) -> Forecast:
        check_tool(tool)
        v = self._sorted
        if not v:
            return _point_forecast(tool, self.PRIOR_MEDIAN_S, 0, "prior")
        m = len(v) // 2
        med = v[m] if len(v) % 2 else 0.5 * (v[m - 1] + v[m])
        return _point_forecast(tool, med, len(v), "global")
