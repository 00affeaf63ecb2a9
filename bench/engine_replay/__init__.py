"""`kvtier bench engine`: agent traces replayed through the real engine classes."""

# The replay's default KV bytes per token (``workload.Geometry``), here so that the command
# line can show it without importing numpy at start-up.
BYTES_PER_TOKEN = 2048
