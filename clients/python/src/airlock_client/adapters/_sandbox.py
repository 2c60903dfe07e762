"""Where an adapter's code runs, shared by the adapters: a fresh sandbox for each call
(`run_once`, `arun_once`), or one session kept between calls like a REPL (`Kernel`,
`AsyncKernel`), from synchronous or asynchronous code, with the client the caller gave or one
made from `$AIRLOCK_URL` and `$AIRLOCK_API_KEY`.

A session can end under a tool: its idle timeout or lifetime passes, or a cell ends the
interpreter (`exit()`, a memory kill). The next call then opens a new session and says so in
its note; it never runs a cell twice (a refused cell did not run)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Callable, Mapping, Union

from airlock_client.aio import AsyncAirlock, AsyncSession
from airlock_client.client import Airlock, Session
from airlock_client.errors import AirlockError, NotFound, SessionEnded
from airlock_client.models import Execution

__all__ = ["AnyClient", "AsyncKernel", "Kernel", "Options", "arun_once", "run_once"]

AnyClient = Union[Airlock, AsyncAirlock]

# The note of a call that ran in a new session replacing an ended one.
RESTARTED = ("the previous session had ended (idle timeout, lifetime or exit): this code ran "
             "in a fresh interpreter, without the earlier variables and files")


@dataclass(frozen=True)
class Options:
    """The sandbox's settings, as `Airlock.run` and `Airlock.session` take them: `limits`
    (`timeout_ms`, `memory_mb`, `cpu_ms`, ...), `files` put in the working directory, `env`,
    the named `environment` (packages), `egress` (network), and for sessions their
    `idle_timeout_ms` and `max_lifetime_ms`."""

    limits: Mapping[str, int] | None = None
    files: Mapping[str, bytes | str] | None = None
    env: Mapping[str, str] | None = None
    environment: str | None = None
    egress: Mapping[str, object] | None = None
    idle_timeout_ms: int | None = None
    max_lifetime_ms: int | None = None

    def run(self, client: Airlock, code: str) -> Execution:
        return client.run(code, limits=self.limits, files=self.files, env=self.env,
                          environment=self.environment, egress=self.egress)

    async def arun(self, client: AsyncAirlock, code: str) -> Execution:
        return await client.run(code, limits=self.limits, files=self.files, env=self.env,
                                environment=self.environment, egress=self.egress)

    def session(self, client: Airlock) -> Session:
        return client.session(limits=self.limits, files=self.files, env=self.env,
                              environment=self.environment, egress=self.egress,
                              idle_timeout_ms=self.idle_timeout_ms, max_lifetime_ms=self.max_lifetime_ms)

    async def asession(self, client: AsyncAirlock) -> AsyncSession:
        return await client.session(limits=self.limits, files=self.files, env=self.env,
                                    environment=self.environment, egress=self.egress,
                                    idle_timeout_ms=self.idle_timeout_ms,
                                    max_lifetime_ms=self.max_lifetime_ms)


def run_once(client: Airlock | None, code: str, options: Options) -> Execution:
    """`code` in a fresh sandbox, with `client` or one made for this call."""
    if client is not None:
        return options.run(client, code)
    with Airlock() as owned:
        return options.run(owned, code)


async def arun_once(client: AnyClient | None, code: str, options: Options) -> Execution:
    """`run_once` for async callers: an AsyncAirlock is awaited, an Airlock runs in a thread."""
    if isinstance(client, Airlock):
        return await asyncio.to_thread(run_once, client, code, options)
    if client is not None:
        return await options.arun(client, code)
    async with AsyncAirlock() as owned:
        return await options.arun(owned, code)


class Kernel:
    """One session kept between calls, opened at the first. Calls run one at a time (a
    session runs one cell at a time); `setup` runs in each new session before its first cell
    (the smolagents executor defines its tools there)."""

    def __init__(
        self,
        client: Airlock | None,
        options: Options,
        *,
        setup: Callable[[Session], None] | None = None,
    ) -> None:
        self._client = client
        self._owned: Airlock | None = None
        self._options = options
        self._setup = setup
        self._session: Session | None = None
        self._lock = threading.Lock()
        self._lost = False  # a cell ended the last session: say so when the next one opens
        self.closed = False

    @property
    def session(self) -> Session | None:
        """The open session, if any."""
        return self._session

    @property
    def session_id(self) -> str | None:
        """The open session's id, if any."""
        return self._session.id if self._session is not None else None

    def run(self, code: str) -> tuple[Execution, str | None]:
        """Runs a cell; returns its Execution and a note when it ran in a new session that
        replaced an ended one."""
        with self._lock:
            if self.closed:
                raise RuntimeError("this tool's session was closed")
            note = RESTARTED if self._lost else None
            fresh = self._session is None
            session = self._open()
            try:
                execution = session.run(code)
            except (NotFound, SessionEnded):
                if fresh:
                    raise
                # Expired while unused: the cell did not run, so it runs in a new session.
                self._drop()
                session = self._open()
                execution = session.run(code)
                note = RESTARTED
            self._lost = bool(execution.session_ended)
            if self._lost:
                self._drop()
            return execution, note

    def close(self) -> None:
        """Closes the session (destroying its sandbox) and the client made for it."""
        with self._lock:
            self.closed = True
            try:
                self._drop()
            finally:
                if self._owned is not None:
                    self._owned.close()
                    self._owned = None

    def _open(self) -> Session:
        if self._session is None:
            if self._client is None and self._owned is None:
                self._owned = Airlock()
            client = self._client or self._owned
            assert client is not None
            session = self._options.session(client)
            try:
                if self._setup is not None:
                    self._setup(session)
            except BaseException:
                try:
                    session.close()
                except AirlockError:
                    pass
                raise
            self._session = session
        return self._session

    def _drop(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            try:
                session.close()
            except AirlockError:
                pass  # gone already; the server reaps what it cannot close


class AsyncKernel:
    """`Kernel` for async callers: an AsyncSession with an AsyncAirlock (or none given), a
    Kernel driven from a thread with an Airlock."""

    def __init__(self, client: AnyClient | None, options: Options) -> None:
        self._sync = Kernel(client, options) if isinstance(client, Airlock) else None
        self._client = client if isinstance(client, AsyncAirlock) else None
        self._owned: AsyncAirlock | None = None
        self._options = options
        self._session: AsyncSession | None = None
        self._lock: asyncio.Lock | None = None
        self._lost = False
        self.closed = False

    @property
    def session_id(self) -> str | None:
        """The open session's id, if any."""
        if self._sync is not None:
            return self._sync.session.id if self._sync.session is not None else None
        return self._session.id if self._session is not None else None

    async def run(self, code: str) -> tuple[Execution, str | None]:
        """As `Kernel.run`."""
        if self._sync is not None:
            return await asyncio.to_thread(self._sync.run, code)
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.closed:
                raise RuntimeError("this tool's session was closed")
            note = RESTARTED if self._lost else None
            fresh = self._session is None
            session = await self._open()
            try:
                execution = await session.run(code)
            except (NotFound, SessionEnded):
                if fresh:
                    raise
                await self._drop()
                session = await self._open()
                execution = await session.run(code)
                note = RESTARTED
            self._lost = bool(execution.session_ended)
            if self._lost:
                await self._drop()
            return execution, note

    async def close(self) -> None:
        """As `Kernel.close`."""
        if self._sync is not None:
            await asyncio.to_thread(self._sync.close)
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        # After a run that is opening a session, so that no session is left open.
        async with self._lock:
            self.closed = True
            try:
                await self._drop()
            finally:
                if self._owned is not None:
                    await self._owned.close()
                    self._owned = None

    async def _open(self) -> AsyncSession:
        if self._session is None:
            if self._client is None and self._owned is None:
                self._owned = AsyncAirlock()
            client = self._client or self._owned
            assert client is not None
            self._session = await self._options.asession(client)
        return self._session

    async def _drop(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            try:
                await session.close()
            except AirlockError:
                pass

