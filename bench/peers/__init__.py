"""Peer backends measured beside kvtier by ``kvtier bench tiers --peer NAME``."""
