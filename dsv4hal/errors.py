"""Typed errors. Every message says what was wrong, where, and what to do about it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


class Dsv4HalError(Exception):
    """Base class of every error dsv4hal raises on purpose."""

    def __init__(self, message: str, *, remedy: str | None = None) -> None:
        self.message, self.remedy = message, remedy
        # args set here rather than by Exception.__init__, which torch.compile's tracer cannot call: it traces
        # the ops' validation and must be able to build these errors (dsv4hal.custom_ops)
        self.args = (f"{message}\nRemedy: {remedy}" if remedy else message,)


def format_reasons(reasons: Mapping[str, Iterable[str]]) -> str:
    """Render {candidate: [reason, ...]} as an indented block for error messages."""
    lines = []
    for name, why in reasons.items():
        why = list(why)
        lines.append(f"  - {name}: {'; '.join(why) if why else 'eligible'}")
    return "\n".join(lines) if lines else "  (no candidates registered)"


class RegistryError(Dsv4HalError):
    """A plugin registered something inconsistent (duplicate name, priority tie, unknown op)."""


class PluginLoadError(Dsv4HalError):
    """A plugin failed to import or to register (raised in strict mode; a warning otherwise)."""


class PlatformNotFoundError(Dsv4HalError):
    """No platform of that name exists, or the named platform does not match this machine."""


class AmbiguousPlatformError(Dsv4HalError):
    """Several platforms claim this machine with the same priority."""


class BadOverrideError(Dsv4HalError):
    """An override string (environment or API) is malformed or names something unknown."""


class NoKernelError(Dsv4HalError):
    """No registered implementation of an op can run this case on this platform."""


class UnsupportedCaseError(Dsv4HalError):
    """A forced implementation exists but refuses this case."""


class InvalidArgumentError(Dsv4HalError, ValueError):
    """An op argument has the wrong dtype, shape, device, layout or value."""

    def __init__(self, op: str, argument: str, expected: str, got: str, *, remedy: str | None = None) -> None:
        self.op, self.argument, self.expected, self.got = op, argument, expected, got
        Dsv4HalError.__init__(self, f"{op}: argument '{argument}' expected {expected}, got {got}", remedy=remedy)


class PreparedWeightsMismatchError(Dsv4HalError):
    """Weights prepared for one implementation were handed to another (or to one this registry lacks)."""


class UnknownNameError(Dsv4HalError, KeyError):
    """A lookup by name (op, architecture) found nothing. Also a KeyError, for callers that catch lookups."""

    __str__ = Exception.__str__  # KeyError's repr-quoting would mangle the message and its remedy


class UnknownOpError(UnknownNameError, AttributeError):
    """platform.ops has no op of that name. Also an AttributeError, so hasattr(platform.ops, name) stays False."""


class BadCallError(Dsv4HalError, TypeError):
    """An op was called with arguments its signature does not take: too many or too few, or an unknown keyword
    (such as checked=, which is the platform's mode). Also a TypeError, as Python raises for a bad call."""


class UnknownArchError(Dsv4HalError, ValueError):
    """An architecture name dsv4hal does not know (dsv4hal.hardware.ARCHS lists the known ones)."""


class PluginFaultError(PluginLoadError):
    """A loaded plugin failed later: a kernel target that does not import, or a supports()/claims() that raised.
    Strict mode raises it; otherwise the fault is recorded in registry.plugin_errors and the entry refused."""


class LockError(Dsv4HalError):
    """A lock file (dsv4hal tune) cannot be used: not a path, missing, not UTF-8 JSON, nested too deep, of an unknown
    format version, or of the wrong shape (dsv4hal.lock_schema names the field by its JSON path)."""


class LockMismatchError(LockError):
    """A lock does not match this machine, its libraries, its registry or the case at hand; it is refused rather
    than half-applied (select_platform(lock_mismatch="reselect") re-selects instead and says so in explain)."""


class CollectiveError(Dsv4HalError, ValueError):
    """A setup or call over a process group that the ranks refused together (dsv4hal.distributed.agree): every rank
    raises it; `failures` maps each rank that found a problem to what it found."""

    def __init__(self, message: str, *, remedy: str | None = None, failures: Mapping[int, str] | None = None) -> None:
        self.failures = dict(failures or {})
        Dsv4HalError.__init__(self, message, remedy=remedy)


class ExpertParallelError(CollectiveError):
    """An expert-parallel setup or call that the ranks refused together: every rank of the group raises it, naming
    each rank that found a problem (mismatched world sizes or configs, an expert map that misses a logical expert, a
    batch larger than max_tokens_per_rank, a bad argument on some rank) or a collective that timed out."""


class TensorParallelError(CollectiveError):
    """A tensor-parallel setup or all-reduce that the ranks refused together: every rank of the group raises it,
    naming each rank that found a problem (a world size or config other than the group's or rank 0's, a tensor
    whose shape or dtype differs from rank 0's) or a collective that timed out."""


class OffloadCapacityError(InvalidArgumentError):
    """An offloaded pool's working set cannot hold what a call needs (dsv4hal.offload): the message names the
    minimum working set."""
