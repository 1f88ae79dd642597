"""The resume state of a loader: the version-2 ``state_dict``, merging ranks' states, upgrading version 1, and checking a state before it is used.

A state describes the epoch, not one rank (``docs/loader.md``, "Resuming"): the epoch,
what decides its order (seed, shuffle, order and block parameters, dataset size), and
``consumed``, the ``[start, stop)`` intervals of the epoch's order that all ranks together
have read. Everything here is pure: it reads and makes plain dicts and asks the epoch
plan (:class:`fastload.sampler.EpochSampler`, or the plan of a user's sampler) where
batches fall; the loader applies the result under its own lock.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from .dlcompat import SamplerPlan
from .errors import ConfigError
from .sampler import EpochSampler, check_intervals, interval_mask

FORMAT = "fastload.FastLoader"
STATE_VERSION = 2  # 2: the state describes the epoch (consumed positions), not one rank

#: A state's fields and their types (None: may be None); ``sampler`` (any value) is required too.
STATE_TYPES: dict[str, tuple] = {
    "epoch": (int,), "batches_done": (int,), "consumed": (list,), "resumed_from": (list,),
    "samples_consumed": (int, None), "seed": (int,), "num_samples": (int,), "shuffle": (bool,), "order": (str,),
    "block_size": (int, None), "window": (int, None), "batch_size": (int, None), "world_size": (int,),
    "drop_last": (bool,), "pad": (bool,), "sampler": (object,),
}  # fmt: skip
#: The fields of a version-1 state (one rank's position), still loaded on the same world and batch size.
V1_KEYS = ("epoch", "batches_done", "seed", "num_samples", "batch_size", "world_size", "rank", "shuffle", "drop_last")


@dataclasses.dataclass(frozen=True)
class Shape:
    """What a loader's state records of the loader itself: its order, and how it batches and shares."""

    seed: int
    num_samples: int
    shuffle: bool
    order: str  # "global", "block", or "sampler" (a sampler= or batch_sampler= of the user's)
    block_size: int | None
    window: int | None
    batch_size: int | None
    world_size: int
    drop_last: bool
    pad: bool


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a checked state resumes: the epoch, the next batch, and (own order) what it consumed."""

    epoch: int
    batch: int
    consumed: np.ndarray | None = None  # the epoch's consumed positions (FastLoader's own order)
    sampler_state: tuple | None = None  # (epoch, the user's sampler state) to load at that epoch's start


def make_state(plan: EpochSampler | SamplerPlan, shape: Shape, *, epoch: int, done: int) -> dict[str, Any]:
    """The JSON-safe state of ``plan``'s epoch ``epoch`` after ``done`` batches on every rank."""
    state: dict[str, Any] = {
        "format": FORMAT,
        "version": STATE_VERSION,
        "epoch": epoch,
        "batches_done": done,
        "consumed": [],
        "resumed_from": [],
        "samples_consumed": None,
        **dataclasses.asdict(shape),
        "sampler": None,
    }
    if isinstance(plan, EpochSampler):
        consumed = plan.consumed_after(epoch, done)
        before = plan.resumed[1] if plan.resumed is not None and plan.resumed[0] == epoch else []
        state["consumed"] = consumed
        state["resumed_from"] = [[int(a), int(b)] for a, b in before]
        state["samples_consumed"] = sum(b - a for a, b in consumed)
    elif plan.stateful is not None:
        for held in (plan.epoch_start_state, plan.pending_state):
            if held is not None and held[0] == epoch:
                state["sampler"] = held[1]
                break
        else:  # the epoch has not started: the sampler stands at its start
            state["sampler"] = plan.stateful.state_dict()
    return state


def saved_plan(state: dict[str, Any], *, rank: int = 0) -> EpochSampler:
    """Rank ``rank``'s plan of the loader that saved ``state`` (FastLoader's own order)."""
    kw = {"block_size": state["block_size"], "window": state["window"]} if state["order"] == "block" else {}
    if state["order"] == "shards":  # how it shares and counts needs no shard layout (only its permutation does)
        kw = {"window": state["window"]}
    try:
        return EpochSampler(
            num_samples=state["num_samples"], batch_size=state["batch_size"], shuffle=state["shuffle"],
            drop_last=state["drop_last"], seed=state["seed"], rank=rank, world_size=state["world_size"],
            pad=state["pad"], order=state["order"], **kw,
        )  # fmt: skip
    except (ConfigError, TypeError) as e:
        raise ConfigError(f"state describes no loader FastLoader can make: {e}") from None


def merge_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One state from every rank's ``state_dict``, in rank order: see ``FastLoader.merge_states``."""
    states = list(states)
    if not states or not all(isinstance(s, dict) and s.get("format") == FORMAT for s in states):
        raise ConfigError("merge_states needs a list of FastLoader state_dicts, one per rank in rank order")
    first = states[0]
    if any(s.get("version") != STATE_VERSION or isinstance(s.get("version"), bool) for s in states):
        raise ConfigError(f"merge_states needs version-{STATE_VERSION} states")
    for r, st in enumerate(states):
        _check_types(st, "state" if r == 0 else f"rank {r}'s state")
    if len(states) != first["world_size"]:
        raise ConfigError(f"merge_states got {len(states)} states for world_size={first['world_size']!r}: give one per rank")
    for r, s in enumerate(states[1:], 1):
        for k in STATE_TYPES:
            if k not in ("batches_done", "consumed", "samples_consumed", "sampler") and s.get(k) != first[k]:
                raise ConfigError(f"rank {r}'s state has {k}={s.get(k)!r:.60} but rank 0's has {first[k]!r:.60}")
    own = saved_plan(first) if first["order"] != "sampler" else None
    for r, st in enumerate(states):
        who = "state" if r == 0 else f"rank {r}'s state"
        _check_position(st, who, r)
        if own is not None:  # what its batches consumed, computed again: a state is not taken on trust
            want = own.consumed_after(st["epoch"], st["batches_done"], consumed=st["resumed_from"])
            if want != st["consumed"]:
                raise ConfigError(
                    f"{who} has consumed={st['consumed']!r:.60} but batches_done={st['batches_done']} of epoch "
                    f"{st['epoch']} consumes {want!r:.60}: not a state a FastLoader saved"
                )
    done = [s["batches_done"] for s in states]
    if len(set(done)) == 1:
        return dict(first)
    if first["order"] == "sampler":
        raise ConfigError(
            f"the ranks stand at batches {done} of a loader with its own sampler=: FastLoader cannot "
            "tell which samples that sampler gave them; checkpoint all ranks at the same step"
        )
    consumed = saved_plan(first).consumed_after(first["epoch"], done, consumed=first["resumed_from"])
    total = sum(b - a for a, b in consumed)
    return {**first, "batches_done": 0, "consumed": consumed, "resumed_from": consumed, "samples_consumed": total}


def upgrade_v1(state: dict[str, Any], plan: EpochSampler | SamplerPlan, shape: Shape) -> dict[str, Any]:
    """A version-1 state (one rank's batch count) as version 2: only on the same world and batch size."""
    for k in ("world_size", "batch_size"):
        if k in state and state[k] != getattr(shape, k):
            raise ConfigError(
                f"state is a version-1 state (saved by a fastload without elastic resume) with {k}={state[k]!r}, "
                f"but this loader has {k}={getattr(shape, k)!r}: a version-1 state resumes only on the same "
                "world_size and batch_size; save it again with this version to change them"
            )
    missing = [k for k in V1_KEYS if k not in state]
    if missing:
        raise ConfigError(f"state lacks {', '.join(missing)}: not a complete FastLoader state_dict")
    epoch, done = state["epoch"], state["batches_done"]
    consumed: list[list[int]] = []
    own = isinstance(plan, EpochSampler)
    if own and all(type(v) is int for v in (epoch, done)) and 0 <= done <= len(plan) and epoch >= 0:
        consumed = plan.consumed_after(epoch, done, consumed=[])
    return {
        **{k: state[k] for k in V1_KEYS}, "format": state["format"], "version": STATE_VERSION,
        "consumed": consumed, "resumed_from": [], "samples_consumed": sum(b - a for a, b in consumed),
        "order": shape.order, "block_size": shape.block_size, "window": shape.window,
        "pad": shape.pad, "sampler": None,
    }  # fmt: skip


def _check_types(state: dict[str, Any], who: str) -> None:
    """Every field of a version-2 state present and of its type (``who`` names the state in errors)."""
    missing = [k for k in STATE_TYPES if k not in state]
    if missing:
        raise ConfigError(f"{who} lacks {', '.join(missing)}: not a complete FastLoader state_dict")
    for k, kinds in STATE_TYPES.items():
        v = state[k]
        if not any(v is None if kind is None else kind is object or type(v) is kind for kind in kinds):
            expected = " or ".join("None" if kind is None else kind.__name__ for kind in kinds)
            raise ConfigError(f"{who} has {k}={v!r:.40} ({type(v).__name__}); expected {expected}")


def _check_position(state: dict[str, Any], who: str, rank: int) -> None:
    """A state's epoch, batch count and intervals possible for the loader it describes (rank ``rank``)."""
    n, epoch, done = state["num_samples"], state["epoch"], state["batches_done"]
    if epoch < 0 or done < 0:
        raise ConfigError(f"{who} has an invalid position: epoch={epoch}, batches_done={done}")
    for k in ("consumed", "resumed_from"):
        try:
            check_intervals(k, state[k], n)
        except ConfigError as e:
            raise ConfigError(f"{who} has an invalid {e}") from None
    if state["order"] != "sampler":
        total = len(saved_plan(state, rank=rank))
        if done > total:
            raise ConfigError(f"{who} has an invalid position: epoch={epoch}, batches_done={done} (0..{total})")


def checked_state(state: Any, plan: EpochSampler | SamplerPlan, shape: Shape) -> dict[str, Any]:
    """``state`` as a complete version-2 state of a loader with ``shape``, or a ConfigError saying why not."""
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ConfigError(f"state is not a FastLoader state_dict: {state!r:.80}")
    version = state.get("version")
    if isinstance(version, bool) or version not in (1, STATE_VERSION):
        raise ConfigError(f"state version {version!r} is not supported (expected {STATE_VERSION}, or 1)")
    if version == 1:
        state = upgrade_v1(state, plan, shape)
    _check_types(state, "state")
    must_match = {"seed": shape.seed, "num_samples": shape.num_samples, "shuffle": shape.shuffle, "order": shape.order}
    if shape.order == "block":
        must_match.update(block_size=shape.block_size, window=shape.window)
    if shape.order == "shards":
        must_match.update(window=shape.window)
    for k, mine in must_match.items():
        if state[k] != mine:
            hint = f" (pass window={state[k]!r})" if k == "window" and shape.order == "shards" else ""
            raise ConfigError(f"state has {k}={state[k]!r} but this loader has {k}={mine!r}; resume needs the same{hint}")
    return state


def resume_position(state: Any, plan: EpochSampler | SamplerPlan, shape: Shape, *, sampler_name: str) -> Position:
    """Where the loader of ``plan`` and ``shape`` resumes ``state`` (checked first).

    ``sampler_name`` names a user's sampler in the messages about it.
    """
    state = checked_state(state, plan, shape)
    n = shape.num_samples
    try:
        consumed = check_intervals("consumed", state["consumed"], n)
        before = check_intervals("resumed_from", state["resumed_from"], n)
    except ConfigError as e:
        raise ConfigError(f"state has an invalid {e}") from None
    if (interval_mask(before, n) & ~interval_mask(consumed, n)).any():
        raise ConfigError("state has resumed_from outside consumed: not a FastLoader state_dict")
    epoch, done = state["epoch"], state["batches_done"]
    if epoch < 0 or done < 0:
        raise ConfigError(f"state has an invalid position: epoch={epoch}, batches_done={done}")
    if isinstance(plan, SamplerPlan):
        return _sampler_position(plan, state, shape, epoch, done, sampler_name)
    same = all(state[k] == getattr(shape, k) for k in ("world_size", "batch_size", "drop_last", "pad"))
    base, start = consumed, plan.first_batch(epoch, consumed)
    if same:
        total = len(plan)
        if done > total:
            raise ConfigError(f"state has an invalid position: epoch={epoch}, batches_done={done} (0..{total})")
        if plan.consumed_after(epoch, done, consumed=before) == consumed.tolist():
            # the very plan the state was saved from, at its batch
            base, start = before, max(done, plan.first_batch(epoch, before))
    elif done:
        saved = len(saved_plan(state))
        if done > saved:
            raise ConfigError(f"state has an invalid position: epoch={epoch}, batches_done={done} (0..{saved})")
        if done == saved:  # the saving ranks finished that epoch: what they left out stays out
            base, start = np.empty((0, 2), dtype=np.int64), 0
            epoch += 1
    if start >= len(plan):  # nothing left of that epoch here
        epoch, base, start = epoch + 1, np.empty((0, 2), dtype=np.int64), 0
    return Position(epoch, start, consumed=base)


def _sampler_position(plan: SamplerPlan, state: dict[str, Any], shape: Shape, epoch: int, done: int, name: str) -> Position:
    """With a user's sampler: it shards, so only its own world and batch size resume."""
    for k in ("world_size", "batch_size"):
        if state[k] != getattr(shape, k):
            raise ConfigError(
                f"state has {k}={state[k]!r} but this loader has {k}={getattr(shape, k)!r}: with a sampler= "
                "of your own the sampler shares the epoch among the ranks, so FastLoader resumes it only on "
                f"the same {k} (without sampler=, FastLoader's own order resumes on any)"
            )
    if done > len(plan):
        raise ConfigError(f"state has an invalid position: epoch={epoch}, batches_done={done} (0..{len(plan)})")
    mid = 0 < done < len(plan)
    if mid and plan.stateful is None and not plan.replayable:
        raise ConfigError(
            f"the sampler {name} has no state_dict()/load_state_dict(), and iterating it again may give "
            f"another order, so the rest of epoch {epoch} cannot be resumed exactly: give a sampler that "
            "has them (or a DistributedSampler, a SequentialSampler, a list of indices), or resume "
            "from a checkpoint taken at the end of an epoch"
        )
    if mid and plan.stateful is not None and state["sampler"] is None:
        raise ConfigError(f"state has sampler=None but the sampler {name} resumes from its own state")
    if done == len(plan):
        epoch, done = epoch + 1, 0
    pending = (epoch, state["sampler"]) if done and plan.stateful is not None else None
    return Position(epoch, done, sampler_state=pending)
