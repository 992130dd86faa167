"""OOM diagnosis: which memory ran out, and which setting to change.

``evidence`` reads vLLM/PyTorch logs, kernel and journald lines, with ``k8s`` for
``kubectl`` output and ``xid`` for NVIDIA's XID table; ``context`` gathers the engine
settings and GPU history around it; ``verdict`` classifies the OOM and names the fix.
"""
