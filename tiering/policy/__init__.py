"""Pause decisions: prices and optimisers, the expected-cost policy and its options, the
baselines, and the registry (:func:`kvtier.tiering.policy.policies.make_policy`).

Imports :mod:`kvtier.tiering.model` and :mod:`kvtier.tiering.forecasting`.
"""
