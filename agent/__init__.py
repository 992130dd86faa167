"""sre-agent: a Prometheus-driven SRE agent for vLLM and LMDeploy inference fleets.

The package is flat, one concept per module, layered sources -> store -> evaluate -> act
(see DESIGN.md in the project docs). Nothing here runs at import time.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
