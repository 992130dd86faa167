"""One running agent that fuzz targets post to: an Agent serving HTTP on 127.0.0.1:0 on a background
event loop, with a client session on the same loop, so that each example waits for its answer with a
deadline and a hang fails the example instead of the suite. In-memory state, no targets, no rules.

Also the strategy for arbitrary small JSON values that the HTTP targets share.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import aiohttp
from hypothesis import strategies as st

from agent.app.daemon import Agent
from agent.config import Config
from tests.fake_pynvml import FakeNvml

__all__ = ["ANSWER_S", "JSON_VALUES", "RunningAgent"]

T = TypeVar("T")
ANSWER_S = 10.0

#: Any small JSON value: scalars (NaN and huge integers included), lists and objects a few levels deep.
JSON_VALUES = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10)),
                           lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                           max_leaves=10)


class RunningAgent:
    """An Agent serving HTTP on a background event loop; :meth:`close` stops both."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()
        config = Config.model_validate({"targets": [], "server": {"listen": "127.0.0.1:0"},
                                        "state": {"path": ":memory:"}, "nvml": {"enabled": False},
                                        "rules": {"files": []}})
        self.agent = Agent(config, nvml_module=FakeNvml().module, hostname="fuzz")
        self.run(self.agent.start())
        self.base = f"http://127.0.0.1:{self.agent.port}"
        self.http = self.run(self._session())

    @staticmethod
    async def _session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=ANSWER_S))

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=ANSWER_S + 5)

    def post(self, path: str, data: bytes) -> tuple[int, dict[str, Any]]:
        """POST ``data`` as JSON to ``path``; the status and the answer (an object, or what it was instead)."""
        async def go() -> tuple[int, dict[str, Any]]:
            async with self.http.post(f"{self.base}{path}", data=data,
                                      headers={"Content-Type": "application/json"}) as r:
                text = await r.text()
            try:
                answer = json.loads(text)
            except ValueError:
                answer = {"status": "not JSON", "text": text[:200]}
            return r.status, answer if isinstance(answer, dict) else {"status": "not an object"}
        return self.run(go())

    def status(self, path: str) -> int:
        """The status of ``GET path``."""
        async def go() -> int:
            async with self.http.get(f"{self.base}{path}") as r:
                await r.read()
                return r.status
        return self.run(go())

    def close(self) -> None:
        self.run(self.http.close())
        self.run(self.agent.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=ANSWER_S)
        self.loop.close()
