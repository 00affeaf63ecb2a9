"""`kvtier bench engine`: agent traces replayed through the real engine classes."""
