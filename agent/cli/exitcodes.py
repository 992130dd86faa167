"""The command line's exit statuses, shared by every subcommand module.

0 = ran and found nothing wrong, 1 = ran and found a problem (a check failed, a
diagnosis found something to fix), 2 = bad input (config, flags, unreadable files).
"""

from __future__ import annotations

__all__ = ["EXIT_BAD_INPUT", "EXIT_OK", "EXIT_PROBLEM"]

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_BAD_INPUT = 2
