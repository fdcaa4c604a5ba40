"""Launcher detection and the process groups of one run: `init_distributed` -> `DistContext`.

Every rank runs the same command. Under torchrun (or ``python -m torch.distributed.run``, one node
or many) the environment names this process's place: RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT. Without them the run is one process: the context is
trivial, no process group exists, and every helper in this package does what one process would.

Backends: gloo on CPU, nccl on CUDA (each rank takes cuda:LOCAL_RANK when the user asked for
``cuda``). Python objects (results, error flags) always travel over gloo, so they never touch the
GPU. Every collective has a timeout (`timeout_s`): a rank that dies closes its sockets and the
others fail at once; a rank that hangs is given up on after the timeout.

Chunk parallel (`chunk_parallel` P >= 1, dividing the world size): consecutive ranks
[gP, (g+1)P) form group g. The ranks of a group share one sequence (each owns a contiguous slice)
and together count as one data-parallel worker: they receive the same units. Only the ranks of a
group exchange tensors, over the group's own process group (`DistContext.chunk`).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch

from ..errors import fail
from .faults import Watchdog, check, on_failure

_RUNS = itertools.count()  # process groups this process has created, one after another
DEFAULT_TIMEOUT_S = 1800.0  # torch's own default for gloo; a unit (one sweep batch) must fit in it
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Launch:
    """Where this process sits, as the launcher's environment says."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def detect_launch(env: Mapping[str, str] | None = None) -> Launch | None:
    """This process's place under torchrun, or None when no launcher started it (one process).

    RANK and WORLD_SIZE decide: both set means launched; one without the other is an error.
    """
    env = os.environ if env is None else env
    if "RANK" not in env and "WORLD_SIZE" not in env:
        return None
    missing = [v for v in ("RANK", "WORLD_SIZE") if v not in env]
    if missing:
        raise fail(
            f"environment variable {missing[0]} is not set although {'RANK' if missing[0] != 'RANK' else 'WORLD_SIZE'}"
            " is: a half-configured distributed launch",
            "start the ranks with torchrun (it sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)",
        )
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local_rank = int(env.get("LOCAL_RANK", rank))
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
    except ValueError:
        raise fail(
            f"RANK={env.get('RANK')!r}, WORLD_SIZE={env.get('WORLD_SIZE')!r}, LOCAL_RANK={env.get('LOCAL_RANK')!r} "
            "are not all integers",
            "start the ranks with torchrun",
        ) from None
    if world < 1 or not 0 <= rank < world or not 0 <= local_rank < max(local_world, 1):
        raise fail(
            f"RANK={rank}, LOCAL_RANK={local_rank}, WORLD_SIZE={world} do not fit together", "start with torchrun"
        )
    return Launch(rank, world, local_rank, local_world)


@dataclass
class ChunkGroup:
    """The ranks that share one sequence under --chunk-parallel: `size` ranks, global `ranks` in slice
    order, this process at index `rank` (0: the group's leader, which reports its results)."""

    size: int = 1
    rank: int = 0
    ranks: tuple[int, ...] = (0,)
    group: Any = None  # torch.distributed.ProcessGroup, None when size == 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # where exchanged tensors live

    @property
    def is_leader(self) -> bool:
        return self.rank == 0


def validate_chunk_parallel(chunk_parallel: Any, world_size: int) -> int:
    """P as an int, checked: at least 1 and dividing the number of ranks."""
    if isinstance(chunk_parallel, bool) or not isinstance(chunk_parallel, int) or chunk_parallel < 1:
        raise fail(f"--chunk-parallel must be a whole number >= 1, got {chunk_parallel!r}")
    if world_size % chunk_parallel:
        if world_size == 1:
            raise fail(
                f"--chunk-parallel {chunk_parallel} needs {chunk_parallel} ranks but this is a single process",
                f"launch with torchrun --nproc-per-node {chunk_parallel} (or a multiple of it)",
            )
        raise fail(
            f"--chunk-parallel {chunk_parallel} does not divide the {world_size} ranks",
            f"launch a multiple of {chunk_parallel} ranks, or pick a --chunk-parallel that divides {world_size}",
        )
    return chunk_parallel


def resolve_device(device: str | torch.device, launch: Launch | None) -> torch.device:
    """The device of this rank: ``cuda`` becomes cuda:LOCAL_RANK when launched; cuda:N is kept only when
    it cannot be shared by two ranks of this node."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise fail(f"unknown device {device!r}", "use cpu, cuda or cuda:N") from None
    if dev.type != "cuda" or launch is None or launch.world_size == 1:
        return dev
    if not torch.cuda.is_available():
        raise fail(f"device {device} requested but CUDA is not available", "use --device cpu")
    if dev.index is not None:
        if launch.local_world_size > 1:
            raise fail(
                f"--device {device} names one GPU for the {launch.local_world_size} ranks of this node",
                "use --device cuda: each rank then takes cuda:LOCAL_RANK",
            )
        return dev
    count = torch.cuda.device_count()
    if launch.local_rank >= count:
        raise fail(
            f"rank {launch.rank} has LOCAL_RANK {launch.local_rank} but this node has {count} GPU(s)",
            f"launch at most {count} ranks per node (torchrun --nproc-per-node {count})",
        )
    return torch.device("cuda", launch.local_rank)


class DistContext:
    """This process's place in the run and the process groups it uses.

    rank, world_size, local_rank: as launched (0, 1, 0 for one process); backend: "gloo", "nccl" or
    None (one process); device: this rank's device; chunk: its chunk-parallel group;
    timeout_s: the timeout of every collective. Data-parallel groups: `num_groups` of them, this rank
    in group `group_index`.

    Use it as a context manager: on leaving, the process group is destroyed; when the body raises, the
    other ranks are told (see megaeval.distributed.faults) so that every rank stops within seconds
    with a MegaevalError that names the failing rank.
    """

    def __init__(
        self,
        rank: int = 0,
        world_size: int = 1,
        local_rank: int = 0,
        backend: str | None = None,
        device: torch.device | str = "cpu",
        chunk: ChunkGroup | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ):
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.backend = backend
        self.device = torch.device(device)
        self.chunk = chunk or ChunkGroup(device=torch.device("cpu"))
        self.timeout_s = timeout_s
        self.object_group: Any = None  # gloo group for Python objects (None: the default group)
        self.store: Any = None  # a key-value store all ranks share (torch.distributed.Store), for faults
        self.watchdog: Any = None  # faults.Watchdog while the process group lives
        self.closed = False

    # ---------------------------------------------------------------------------- who is who

    @property
    def is_distributed(self) -> bool:
        """True when a process group joins several ranks."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """True on rank 0, the one that journals progress and writes reports."""
        return self.rank == 0

    @property
    def chunk_parallel(self) -> int:
        return self.chunk.size

    @property
    def num_groups(self) -> int:
        """Number of data-parallel groups (workers that take units)."""
        return self.world_size // self.chunk.size

    @property
    def group_index(self) -> int:
        """This rank's data-parallel group."""
        return self.rank // self.chunk.size

    @property
    def reports(self) -> bool:
        """True when this rank's results count: the leader of its chunk-parallel group."""
        return self.chunk.is_leader

    def describe(self) -> dict[str, Any]:
        """Facts for reports: how the run was spread."""
        return {
            "world_size": self.world_size,
            "chunk_parallel": self.chunk.size,
            "data_parallel": self.num_groups,
            "backend": self.backend,
        }

    def __repr__(self) -> str:
        return (
            f"DistContext(rank={self.rank}, world_size={self.world_size}, local_rank={self.local_rank}, "
            f"backend={self.backend!r}, device={str(self.device)!r}, chunk_parallel={self.chunk.size})"
        )

    # ---------------------------------------------------------------------------- collectives

    def check(self, error: BaseException | None = None) -> None:
        """Collective (every rank calls it): raise on every rank if any rank passes an error; see faults.check."""
        check(self, error)

    def barrier(self) -> None:
        """Wait for every rank (over gloo, with the timeout)."""
        if self.is_distributed:
            import torch.distributed as dist

            dist.barrier(group=self.object_group)

    # ---------------------------------------------------------------------------- lifetime

    def close(self, together: bool = False) -> None:
        """Stop the watchdog and destroy the process groups (idempotent). `together` (every rank is closing after a
        run that succeeded): rank 0, whose process holds the store, waits until the other ranks have closed."""
        if self.closed:
            return
        self.closed = True
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.is_distributed:
            import torch.distributed as dist

            if dist.is_initialized():
                try:
                    dist.destroy_process_group()
                except Exception:  # noqa: BLE001  (a broken group is gone anyway)
                    pass
            if together:
                self._leave_last()

    def _leave_last(self, patience_s: float = 30.0) -> None:
        """The other ranks say they have closed; rank 0 waits for all of them (at most `patience_s`), so that no
        rank still talks to the store when the process holding it ends."""
        import time

        if self.store is None:
            return
        try:
            if not self.is_main:
                self.store.add("closed", 1)
                return
            deadline = time.monotonic() + patience_s
            while self.store.add("closed", 0) < self.world_size - 1 and time.monotonic() < deadline:
                time.sleep(0.01)
        except Exception:  # noqa: BLE001  (a rank that cannot reach the store has nothing left to say)
            pass

    def __enter__(self) -> DistContext:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc is not None and self.is_distributed:
                on_failure(self, exc)  # raises the exception every rank should see
            elif self.is_distributed and not self.closed:
                self._finish_together()
                self.close(together=True)
        finally:
            self.close()

    def _finish_together(self) -> None:
        """Every rank stops its watchdog before any rank tears the group down: rank 0 holds the store the watchdogs
        poll, and a rank still polling a store that has gone can abort at exit."""
        if self.watchdog is not None:
            self.watchdog.stop()
        self.barrier()


def init_distributed(
    device: str | torch.device = "cpu",
    chunk_parallel: int = 1,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    init_method: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    env: Mapping[str, str] | None = None,
) -> DistContext:
    """Join the run: detect the launcher, check --chunk-parallel, pick the device and backend, create the
    process groups (each with `timeout_s`) and return the context; a single process when not launched.

    `init_method` ("env://" by default; "file://PATH" or "tcp://HOST:PORT" with explicit `rank` and
    `world_size`, e.g. in tests) overrides how the ranks find each other.
    """
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise fail("init_distributed needs both rank and world_size, or neither")
        launch = Launch(rank, world_size, rank if local_rank is None else local_rank, world_size)
    else:
        launch = detect_launch(env)
    world = 1 if launch is None else launch.world_size
    P = validate_chunk_parallel(chunk_parallel, world)
    if not timeout_s or timeout_s <= 0:
        raise fail(f"the distributed timeout must be positive, got {timeout_s!r} s")
    dev = resolve_device(device, launch)
    if launch is None or world == 1:
        return DistContext(device=dev, chunk=ChunkGroup(device=dev), timeout_s=timeout_s)

    import torch.distributed as dist

    if not dist.is_available():
        raise fail("this torch build has no torch.distributed", "install a torch build with distributed support")
    if dist.is_initialized():
        raise fail("a torch.distributed process group already exists in this process")
    if init_method is None:
        env_map = os.environ if env is None else env
        absent = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not env_map.get(v)]
        if absent:
            raise fail(f"environment variable {absent[0]} is not set", "start the ranks with torchrun")
        init_method = "env://"
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    timeout = timedelta(seconds=timeout_s)
    try:
        store, _, _ = next(dist.rendezvous(init_method, launch.rank, launch.world_size, timeout=timeout))
        store.set_timeout(timeout)
        # a process may join several runs one after another (tests, benchmarks): keys of an earlier one
        # in a shared store (torchrun's agent keeps one across restarts too) must not count
        attempt = (os.environ if env is None else env).get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"megaeval/{attempt}/{next(_RUNS)}", store)
        dist.init_process_group(
            backend,
            store=dist.PrefixStore("default_pg", store),
            rank=launch.rank,
            world_size=launch.world_size,
            timeout=timeout,
        )
    except Exception as e:  # noqa: BLE001  (rendezvous failures come in many types)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise fail(
            f"rank {launch.rank} could not join the other {launch.world_size - 1} rank(s) "
            f"within {timeout_s:g} s: {first}",
            "check that every rank was started with the same MASTER_ADDR/MASTER_PORT and can reach it",
        ) from e

    ctx = DistContext(launch.rank, launch.world_size, launch.local_rank, backend, dev, timeout_s=timeout_s)
    ctx.store = dist.PrefixStore("faults", store)
    ctx.object_group = None if backend == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    chunk = ChunkGroup(device=dev if backend == "nccl" else torch.device("cpu"))
    for g in range(launch.world_size // P):  # every rank creates every group, in the same order
        ranks = tuple(range(g * P, (g + 1) * P))
        group = dist.new_group(list(ranks), timeout=timeout) if P > 1 else None
        if launch.rank in ranks:
            chunk = ChunkGroup(P, launch.rank - g * P, ranks, group, chunk.device)
    ctx.chunk = chunk
    ctx.watchdog = Watchdog(ctx)
    ctx.watchdog.start()
    return ctx
