"""The tool-wait predictor: input checks and features, the quantile sketch, forecasts and
the Predictor contract, the back-off predictor and its baselines.

Imports only :mod:`kvtier.tiering.model`.
"""
