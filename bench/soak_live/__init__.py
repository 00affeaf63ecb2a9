"""``kvtier bench soak --live``: one ``vllm serve`` with kvtier (host frames, NVMe, a Redis tier
written through) serving agent sessions while a seeded schedule of faults runs, every output
checked against a recompute of the same prompt.

::

    redis-server 127.0.0.1:R  <── kvtier in the engine (write-through)     rig.py
    vllm serve 127.0.0.1:P, data dir workdir/engine-0                        rig.py
    agents thread: sessions' turns over HTTP, each checked                   agents.py
    faults thread: schedule.py's plan, one Fault at a time                   faults.py
    sampler thread: RSS, fds, threads of the engine's processes, /metrics    run.py

Modules: :mod:`.rig` (the processes), :mod:`.redis_ctl` (RESP commands), :mod:`.faults` (one
class per fault kind), :mod:`.schedule` (seeded plan), :mod:`.agents` (the checked workload),
:mod:`.run` (the soak), :mod:`.report` (table, JSON, plot), :mod:`.cmd` (the CLI).
"""
