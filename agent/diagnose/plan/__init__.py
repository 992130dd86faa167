"""The GPU memory planner: will this model fit, how many sequences, and what to change.

``models`` holds model shapes (presets and Hugging Face ``config.json``), ``memory`` the
arithmetic (weights, KV bytes per token, activations, reserve), ``planner`` the verdict
and its findings, ``servecmd`` reads a ``vllm serve`` / ``lmdeploy serve`` line, and
``fleet`` turns a live replica's ``vllm:cache_config_info`` and usage history into capacity advice.
"""
