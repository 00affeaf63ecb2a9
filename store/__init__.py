"""kvtier store package."""
