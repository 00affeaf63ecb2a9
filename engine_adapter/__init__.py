"""kvtier engine_adapter package."""
