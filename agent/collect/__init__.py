"""Collection: what comes into the store.

``scrape`` polls vLLM/LMDeploy ``/metrics`` targets (found by ``discovery``) and parses
them with ``exposition``; ``catalog`` names the metric families worth keeping; ``nvml``
polls the GPUs and ``dcgm`` writes the readings under dcgm-exporter names. The layer sits
on the foundation (store, series, config) and imports nothing above it.
"""
