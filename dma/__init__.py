"""kvtier dma package."""
