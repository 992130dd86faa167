"""Property-based fuzzing of the agent's input boundaries (hypothesis).

Why a package of its own instead of ``tests/<pkg>/test_fuzz_*.py``: the fuzz tests share
one budget and one switch. In CI they run as part of the suite with a fixed, derandomized
example count (every run tries the same inputs, so a red build is reproducible and the
suite's time is stable, about 25 s in all on two cores) and write no ``.hypothesis``
directory into the checkout (no example database; hypothesis' own cache goes to the
temp dir). A developer who wants to search harder runs, from the repository root::

    python -m tests.fuzz --minutes 10

which repeats the same tests with the ``long`` profile (random seeds, 50x the examples)
until the time is up or something fails; the failing input is printed with
``@reproduce_failure``. ``HYPOTHESIS_PROFILE=long python -m pytest tests/fuzz -n 0`` runs
one such round by hand.

Targets: the exposition parser (:mod:`agent.collect.exposition`), the matcher parsers
(:mod:`agent.matchers` and PromQL selectors), the silence API of a running agent, its two
intakes (the Alertmanager webhook and forwarded findings), config loading, file_sd files
(:mod:`agent.collect.discovery`), Host headers and
login redirect targets (DNS rebinding, open redirects), and the OOM evidence scanner (a
user's prompt in the request log). Each property states which exceptions the boundary may
raise; anything else is a bug.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.configuration import set_hypothesis_home_dir

__all__ = ["PROFILE", "budget"]

#: Examples multiplier per profile: ci runs the budgets as written, long 50 times them.
_SCALE = {"ci": 1, "long": 50}

# Hypothesis caches what it learns about the code (``constants/``) even without a database:
# keep that out of the checkout.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "sre-agent-hypothesis")
settings.register_profile("ci", deadline=None, database=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", deadline=None, database=None, derandomize=False, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if PROFILE not in _SCALE:
    raise RuntimeError(f"HYPOTHESIS_PROFILE={PROFILE!r}: tests/fuzz knows the profiles {sorted(_SCALE)}")
settings.load_profile(PROFILE)


def budget(examples: int) -> settings:
    """Settings for one property: ``examples`` in CI, scaled up in the long profile."""
    return settings(max_examples=examples * _SCALE[PROFILE])
