"""Bytes, seconds and contracts: the cost model, named models and nodes, capacity and paging
arithmetic, what a policy sees and returns (``decision``), and the tier vocabulary.

Imports nothing else of kvtier (the room every other one builds on).
"""
