"""Control a black-box subject's random numbers: force its draws to a chosen boundary value.

Within ``controlled_randomness(value)`` these entry points return the boundary value instead of a
random one, whether called with a ``torch.Generator`` or not:

* ``torch.rand``, ``torch.rand_like``, ``Tensor.uniform_``: the uniform itself;
* ``Tensor.exponential_``: ``-log(1 - u)``, the exponential its inverse-CDF draw would give;
* ``torch.multinomial``: the token the inverse CDF gives at ``u`` on each row (first token of
  positive mass at u = 0, last at u just below 1); a real draw returns that token with its mass in
  the row, which is what a finding's reachability counts for it (``Draw.element_probability``).

**The value delivered is one the draw can return.** A float32 uniform is a multiple of 2^-24 in
[0, 1) and a float64 one a multiple of 2^-53 (torch's CPU generator); a requested value is rounded
down onto that grid, so ``one_minus_ulp`` is 1 - 2^-24 in a float32 draw and 1 - 2^-53 in a
float64 one, never 1.0. Each draw's delivered value, dtype and size are logged (``DrawLog.draws``)
so an oracle judges the value the subject actually received, and a finding can say how likely its
trigger is (``reachability``: the per-draw probability of that value in that dtype).

**Forcing leaves the subject's generators alone.** The forced entry points draw nothing from the
generator they are given, so after a fully forced call every generator the subject was handed,
torch's global generator, numpy's and Python's global generators must be where they were. If one
moved, a draw escaped the forcing (TorchScript, a compiled kernel, an entry point not wrapped
here, numpy, ``random``); ``DrawLog.escaped`` names it, and a property that needs every draw
forced is then *not judged* on that case, never failed. A reseed or restore of a global source
during the call (``torch.manual_seed``, ``torch.set_rng_state``, numpy's and ``random``'s) is
watched: what moved before it is an escape too, so seeding from the handed generator, drawing
unforced and restoring does not hide the draw.

**Generators the subject creates.** An end-to-end generator is handed a seed, not a generator, and
makes its own (``torch.Generator(device).manual_seed(seed)``). With ``watch_created=True`` every
``torch.Generator`` made inside the block is recorded (``isinstance`` checks still see
``torch.Generator``), and one whose state at the end is not that of a fresh generator with its
``initial_seed()`` moved without a forced draw: an escape, like a handed generator that moved.

**Partial forcing** (``only=`` a set of element indices, counted over the controlled draws of the
call in order) forces just those elements; the rest come from the subject's own generator as
usual. ``exactcheck.step.properties`` uses it to find the fewest forced draws that still break a
property.

Draws through ``torch.randn``, ``torch.randint``, ``torch.bernoulli``, ``torch.normal``,
``torch.poisson``, ``Tensor.random_``, ``Tensor.normal_``, ``Tensor.bernoulli_`` are *not*
controlled; they are counted by name. Uninitialised memory from ``torch.empty``/``empty_like``/
``Tensor.new_empty`` is poisoned (NaN for floating tensors, -1 for integer ones), so code that
reads memory it never wrote shows it.
"""
from __future__ import annotations

import contextlib
import ctypes
import math
import pickle
import random
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = ["controlled_randomness", "watched_randomness", "DrawLog", "Draw", "boundary_value", "deliverable",
           "value_probability", "CONTROLLED", "UNCONTROLLED", "RNGSnapshot", "mt19937_state_view"]

CONTROLLED = ("torch.rand", "torch.rand_like", "Tensor.uniform_", "Tensor.exponential_",
              "torch.multinomial")
UNCONTROLLED = ("torch.randn", "torch.randint", "torch.bernoulli", "torch.normal", "torch.poisson",
                "Tensor.random_", "Tensor.normal_", "Tensor.bernoulli_")

# bits of a uniform from torch's CPU generator, per dtype: its values are multiples of 2^-bits
_GRID_BITS = {torch.float64: 53, torch.float32: 24}


def _grid(dtype: torch.dtype) -> float | None:
    bits = _GRID_BITS.get(dtype)
    return None if bits is None else 2.0 ** -bits


def deliverable(c: float, dtype: torch.dtype) -> float:
    """The value in [0, 1) a uniform draw of ``dtype`` can return nearest below ``c``: rounded
    down onto the 2^-24 (float32) or 2^-53 (float64) grid; for half types, rounded to the dtype
    and moved below 1 if it rounded up to 1."""
    grid = _grid(dtype)
    if grid is not None:
        return min(max(math.floor(c / grid) * grid, 0.0), 1.0 - grid)
    value = torch.tensor(c, dtype=torch.float64).to(dtype)
    one = torch.tensor(1.0, dtype=dtype)
    if bool(value >= one):
        value = torch.nextafter(one, torch.zeros_like(one))
    return float(value.clamp(min=0))


def _compiling() -> bool:
    """Whether torch.compile is tracing now (``torch.compiler.is_compiling``, absent in old releases)."""
    compiler = getattr(torch, "compiler", None)
    check = getattr(compiler, "is_compiling", None)
    return bool(check()) if check is not None else False


def value_probability(c: float, dtype: torch.dtype) -> float:
    """The probability that one uniform draw of ``dtype`` returns exactly ``c`` (a deliverable
    value): 2^-24 for float32, 2^-53 for float64; for half types an upper bound, the spacing of
    the dtype just below 1 (2^-11 float16, 2^-8 bfloat16)."""
    grid = _grid(dtype)
    if grid is not None:
        return grid
    return 1.0 - deliverable(1.0, dtype)


def boundary_value(value: str | float, dtype: torch.dtype = torch.float64) -> float:
    """The uniform a boundary name (or an explicit float in [0, 1]) stands for, delivered in
    ``dtype``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return deliverable(float(value), dtype)
    if value == "zero":
        return 0.0
    if value == "one_minus_ulp":
        return deliverable(1.0, dtype)
    raise ValueError(f"boundary value ({value!r}) must be 'zero', 'one_minus_ulp' or a float in [0, 1)")


@dataclass(frozen=True)
class Draw:
    """One call of a controlled entry point: what it was, its dtype and size, and the value its
    forced elements received (for ``torch.multinomial``, the uniform its inverse CDF used)."""

    entry: str
    dtype: torch.dtype
    numel: int
    value: float
    forced: int  # how many of its elements were forced (all, unless partial forcing)
    # the probability that one element takes its delivered outcome, where it is not the
    # uniform's (a multinomial's token: its mass in the row, any u in its CDF step gives it; the
    # smallest over the rows); None: ``value_probability(value, dtype)``
    outcome_probability: float | None = None

    @property
    def element_probability(self) -> float:
        """The probability that one real draw of this kind returns what was delivered."""
        if self.outcome_probability is not None:
            return self.outcome_probability
        return value_probability(self.value, self.dtype)


@dataclass
class DrawLog:
    """What the subject drew while controlled."""

    controlled: Counter = field(default_factory=Counter)
    uncontrolled: Counter = field(default_factory=Counter)
    draws: list[Draw] = field(default_factory=list)
    escaped: list[str] = field(default_factory=list)  # filled when the block ends

    @property
    def elements(self) -> int:
        """Controlled elements drawn, the index space of partial forcing."""
        return sum(d.numel for d in self.draws)

    def values(self) -> set[float]:
        """The distinct uniforms delivered to forced elements."""
        return {d.value for d in self.draws if d.forced}

    @property
    def complete(self) -> bool:
        """Every draw the subject made was forced (nothing uncontrolled, nothing escaped)."""
        return not self.uncontrolled and not self.escaped

    def describe_uncontrolled(self) -> str:
        return ", ".join(f"{name} x{count}" for name, count in sorted(self.uncontrolled.items()))

    def describe_escapes(self) -> str:
        parts = [f"{name} x{count}" for name, count in sorted(self.uncontrolled.items())]
        return ", ".join(parts + self.escaped)


# numpy's MT19937 state struct: uint32 key[624], then int pos
_MT19937_WORDS = 625
_mt19937_view: list = [None, None]  # [bit generator, a view of its state struct, or None]


def mt19937_state_view(bitgen) -> np.ndarray | None:
    """A uint32 view of an MT19937 bit generator's state struct, read in place through its
    ``ctypes.state_address``; None unless the words it shows are that generator's key and
    position (``bitgen.state``), so a layout numpy changed is never trusted."""
    if type(bitgen).__name__ != "MT19937":
        return None
    try:
        words = (ctypes.c_uint32 * _MT19937_WORDS).from_address(bitgen.ctypes.state_address)
        view = np.ctypeslib.as_array(words)
        state = bitgen.state["state"]
        if np.array_equal(view[:-1], state["key"]) and int(view[-1]) == int(state["pos"]):
            return view
    except (AttributeError, KeyError, TypeError, ValueError):
        pass
    return None


def _numpy_global_state() -> bytes:
    """The state of numpy's global generator, as bytes to compare before and after a call.
    The default MT19937 is read in place (about 0.4 us; ``np.random.get_state()`` copies it
    through Python objects in about 80 us, as long as a verifier call on small inputs); another
    bit generator, or a numpy without ``np.random.get_bit_generator``, is pickled from its state.
    Not compared: the legacy Gaussian cache (the second normal of a pair moves no MT19937 word);
    such a draw shows in the output, which ``properties`` checks by repeating the forced calls
    behind a finding."""
    get = getattr(np.random, "get_bit_generator", None)
    bitgen = get() if get is not None else None
    if bitgen is not None and _mt19937_view[0] is not bitgen:
        _mt19937_view[:] = [bitgen, mt19937_state_view(bitgen)]  # the reference keeps it alive
    view = _mt19937_view[1] if bitgen is not None else None
    return view.tobytes() if view is not None else pickle.dumps(np.random.get_state(legacy=False))


class RNGSnapshot:
    """The state of every random source a subject could draw from without exactcheck forcing
    it: the generators it was handed, torch's global generator (CPU, and CUDA once used),
    numpy's global generator and Python's ``random``. ``moved()`` names the ones that changed.

    A subject may reseed a global generator, draw from it where no forcing reaches (TorchScript,
    a kernel) and restore it, so that nothing looks moved after the call: ``look_again(entry)``,
    called at each reseed or restore, first notes every global source that moved since the last
    look (``found``, by source), then looks afresh."""

    def __init__(self, generators=()):
        self.generators = [g for g in generators if g is not None]
        self.states = [g.get_state() for g in self.generators]
        self.found: dict[str, str] = {}  # global source -> how it was seen drawn from before a reseed
        self.retake()

    def retake(self) -> None:
        """Take the global sources' states afresh."""
        self.torch_cpu = torch.random.get_rng_state()
        self.torch_cuda = (torch.cuda.get_rng_state_all()
                           if torch.cuda.is_available() and torch.cuda.is_initialized() else None)
        self.numpy = _numpy_global_state()
        self.python = random.getstate()

    def _globals_moved(self) -> list[str]:
        out = []
        if not torch.equal(self.torch_cpu, torch.random.get_rng_state()):
            out.append("torch's global generator")
        if self.torch_cuda is not None and any(
                not torch.equal(a, b) for a, b in zip(self.torch_cuda, torch.cuda.get_rng_state_all())):
            out.append("torch's global CUDA generator")
        if self.numpy != _numpy_global_state():
            out.append("numpy's global generator")
        if self.python != random.getstate():
            out.append("Python's random module")
        return out

    def look_again(self, entry: str) -> None:
        """At a reseed or restore through ``entry``: what moved since the last look was drawn
        from outside the forcing; then look afresh (the reseed itself draws nothing)."""
        for name in self._globals_moved():
            self.found.setdefault(name, f"{name}, drawn from outside the forcing, then reseeded or restored "
                                        f"({entry}): the subject derives its random numbers from a seed")
        self.retake()

    def moved(self) -> list[str]:
        out = list(self.found.values())
        if any(not torch.equal(s, g.get_state()) for g, s in zip(self.generators, self.states)):
            out.append("a generator handed to the subject moved without a forced draw "
                       "(a draw inside TorchScript, a compiled kernel or an entry point "
                       "exactcheck does not wrap, or a reseed)")
        return out + [name for name in self._globals_moved() if name not in self.found]


# the functions that reseed or restore a global random source, watched during a forced call
_RESEEDING = [(torch, "manual_seed"), (torch, "seed"), (torch, "set_rng_state"),
              (torch.random, "manual_seed"), (torch.random, "seed"), (torch.random, "set_rng_state"),
              (torch.cuda, "manual_seed"), (torch.cuda, "manual_seed_all"), (torch.cuda, "seed"),
              (torch.cuda, "seed_all"), (torch.cuda, "set_rng_state"), (torch.cuda, "set_rng_state_all"),
              (np.random, "seed"), (np.random, "set_state"), (random, "seed"), (random, "setstate")]


# allocation with the shape arguments of torch.rand / torch.rand_like, taken before any patching
_ALLOCATE = {"rand": torch.empty, "rand_like": torch.empty_like}


_FRESH_ENTROPY = "an unseeded numpy Generator (fresh OS entropy)"


def _entropy_counter(log: DrawLog, owner, name: str, label: str):
    """Wrap ``numpy.random.default_rng``: a call without a seed draws fresh OS entropy."""
    original = getattr(owner, name)

    def fn(seed=None, *args, **kwargs):
        if seed is None:
            log.uncontrolled[label] += 1
        return original(seed, *args, **kwargs)
    return fn


_TORCH_GENERATOR = torch.Generator


def _recording_generator_class(created: list):
    """A ``torch.Generator`` subclass that records every instance made, and that ``isinstance``
    treats as ``torch.Generator`` itself (so code checking a generator made outside still works)."""

    class _Meta(type(_TORCH_GENERATOR)):
        def __instancecheck__(cls, obj):
            return isinstance(obj, _TORCH_GENERATOR)

    class Generator(_TORCH_GENERATOR, metaclass=_Meta):
        def __new__(cls, *args, **kwargs):
            made = _TORCH_GENERATOR.__new__(cls, *args, **kwargs)
            created.append(made)
            return made

    return Generator


def _created_moved(created: list) -> list[str]:
    """The generators made during a forced call whose state is not a fresh one's at their seed."""
    out = []
    for g in created:
        try:
            fresh = _TORCH_GENERATOR(device=g.device).manual_seed(g.initial_seed())
            moved = not torch.equal(fresh.get_state(), g.get_state())
        except RuntimeError:  # a device whose generator state cannot be read: not trusted
            moved = True
        if moved:
            out.append(f"a generator the subject created (seed {g.initial_seed()}) moved without a forced draw "
                       "(a draw inside TorchScript, a compiled kernel or an entry point exactcheck does not "
                       "wrap, or a set_state)")
    return out


@contextlib.contextmanager
def controlled_randomness(value: str | float, poison_empty: bool = True, *, only=None,
                          generators=(), watch_created: bool = False):
    """Force the controllable draws to ``value`` for the duration of the block; yields a
    ``DrawLog``. ``only``: force just these element indices (others drawn as usual).
    ``generators``: the generators handed to the subject, checked for escaped draws when the
    block ends (with ``only`` set, draws are expected to move them and nothing is checked).
    ``watch_created``: also check the ``torch.Generator``s made inside the block.
    Not thread-safe: it swaps attributes of the torch and numpy modules."""
    forcing = _Forcing(value, only)
    forcing.force_draws()
    forcing.count_uncontrolled(poison_empty)
    forcing.watch_sources(generators, watch_created)
    try:
        yield forcing.log
    finally:
        forcing.restore()


def _as_method(fn):
    """``fn`` as a plain function that binds to a tensor when set on ``torch.Tensor`` (a bound
    method set on a class does not rebind)."""
    return lambda self, *args, **kwargs: fn(self, *args, **kwargs)


class _Forcing:
    """One ``controlled_randomness`` block: the forced value, its ``DrawLog``, the attributes it
    swapped (to restore), its spare generators, and the sources it watches for escaped draws."""

    def __init__(self, value: str | float, only):
        self.value = value
        self.log = DrawLog()
        self.saved: dict[tuple[object, str], object] = {}
        self.scratch: dict[str, torch.Generator] = {}
        self.partial = only is not None
        self.only = frozenset(only or ())
        self.snapshot: RNGSnapshot | None = None
        self.created: list = []

    def swap(self, owner, name, fn) -> None:
        self.saved[(owner, name)] = getattr(owner, name)
        setattr(owner, name, fn)

    def original(self, owner, name):
        return self.saved[(owner, name)]

    # the steps: swap the entry points in, watch the sources, restore

    def force_draws(self) -> None:
        """The controlled entry points return the forced value (``CONTROLLED``)."""
        self.swap(torch, "rand", self.rand)
        self.swap(torch, "rand_like", self.rand_like)
        self.swap(torch.Tensor, "uniform_", _as_method(self.uniform_))
        self.swap(torch.Tensor, "exponential_", _as_method(self.exponential_))
        self.swap(torch, "multinomial", self.multinomial)
        self.swap(torch.Tensor, "multinomial", _as_method(self.multinomial))

    def count_uncontrolled(self, poison_empty: bool) -> None:
        """The uncontrolled entry points (and fresh numpy entropy) counted by name; with
        ``poison_empty``, uninitialised memory poisoned."""
        for label in UNCONTROLLED:
            owner_name, name = label.split(".")
            owner = torch if owner_name == "torch" else torch.Tensor
            self.swap(owner, name, self.counting(owner, name, label))
        self.swap(np.random, "default_rng", _entropy_counter(self.log, np.random, "default_rng", _FRESH_ENTROPY))
        if poison_empty:
            self.swap(torch, "empty", self.poisoned(torch, "empty"))
            self.swap(torch, "empty_like", self.poisoned(torch, "empty_like"))
            self.swap(torch.Tensor, "new_empty", self.poisoned(torch.Tensor, "new_empty"))

    def watch_sources(self, generators, watch_created: bool) -> None:
        """Fully forcing: snapshot the handed and global generators (each reseed or restore looked
        at again) and, with ``watch_created``, record the generators made inside the block."""
        self.snapshot = None if self.partial else RNGSnapshot(generators)
        if watch_created and not self.partial:
            self.swap(torch, "Generator", _recording_generator_class(self.created))
        if self.snapshot is not None:
            for owner, name in _RESEEDING:
                if hasattr(owner, name):
                    self.swap(owner, name, self.reseeding(owner, name))

    def restore(self) -> None:
        """Every swapped attribute back; the sources that moved without a forced draw logged."""
        for (owner, name), fn in self.saved.items():
            setattr(owner, name, fn)
        if self.snapshot is not None:
            self.log.escaped.extend(self.snapshot.moved())
            self.log.escaped.extend(_created_moved(self.created))

    # the forced entry points

    def spare(self, device) -> torch.Generator:
        """A throwaway generator on ``device``: torch's own multinomial still validates its
        input, but neither the subject's generator nor the global one moves."""
        key = str(torch.device(device if device is not None else "cpu"))
        if key not in self.scratch:
            self.scratch[key] = _TORCH_GENERATOR(device=key)
        return self.scratch[key]

    def place(self, out: torch.Tensor, entry: str, fill_value) -> torch.Tensor:
        """Record the draw, then write the forced value where it is asked for."""
        log = self.log
        start = log.elements
        c = boundary_value(self.value, out.dtype if out.dtype.is_floating_point else torch.float64)
        if self.partial:
            chosen = [i - start for i in self.only if start <= i < start + out.numel()]
            if chosen:
                flat = out.view(-1)
                flat[torch.tensor(chosen, device=out.device)] = fill_value(c)
        else:
            chosen = range(out.numel())
            out.fill_(fill_value(c))
        log.controlled[entry] += 1
        log.draws.append(Draw(entry, out.dtype, out.numel(), c, len(chosen)))
        return out

    def generated(self, name, args, kwargs):
        """The tensor a draw fills: drawn from the subject's generator when partially forcing,
        else allocated without touching any generator."""
        if self.partial:
            return self.original(torch, name)(*args, **kwargs)
        kwargs = {key: v for key, v in kwargs.items() if key != "generator"}
        return _ALLOCATE[name](*args, **kwargs)

    def rand(self, *args, **kwargs):
        return self.place(self.generated("rand", args, kwargs), "torch.rand", lambda c: c)

    def rand_like(self, *args, **kwargs):
        return self.place(self.generated("rand_like", args, kwargs), "torch.rand_like", lambda c: c)

    def uniform_(self, tensor, a=0.0, b=1.0, *, generator=None):
        if self.partial:
            self.original(torch.Tensor, "uniform_")(tensor, a, b, generator=generator)
        return self.place(tensor, "Tensor.uniform_", lambda c: a + (b - a) * c)

    def exponential_(self, tensor, lambd=1.0, *, generator=None):
        if self.partial:
            self.original(torch.Tensor, "exponential_")(tensor, lambd, generator=generator)
        return self.place(tensor, "Tensor.exponential_", lambda c: -math.log1p(-c) / lambd)

    def multinomial(self, input, num_samples, replacement=False, *, generator=None, out=None):
        # torch's own call first (on a spare generator unless partially forced): it raises on
        # NaN, inf, negative or all-zero rows exactly as the subject would see outside this block
        partial, log = self.partial, self.log
        drawn = self.original(torch, "multinomial")(input, num_samples, replacement,
                                                    generator=generator if partial else self.spare(input.device))
        rows = drawn if drawn.dim() == 2 else drawn[None]
        probs = input.double() if input.dim() == 2 else input.double()[None]
        dtype = input.dtype if input.dtype in _GRID_BITS else torch.float32
        c = boundary_value(self.value, dtype)
        cdf = probs.cumsum(1)
        token = (cdf <= c * cdf[:, -1:]).sum(1)
        last = (cdf < cdf[:, -1:]).sum(1)
        token = torch.minimum(token, last)[:, None].expand(-1, num_samples)
        start = log.elements
        if partial:
            mask = torch.zeros(rows.numel(), dtype=torch.bool)
            chosen = [i - start for i in self.only if start <= i < start + rows.numel()]
            mask[chosen] = True
            result = torch.where(mask.view(rows.shape).to(rows.device), token.to(rows.device), rows)
        else:
            chosen = range(rows.numel())
            result = token.clone().to(rows.device)
        mass = (probs.gather(1, token[:, :1]) / cdf[:, -1:]).min()
        log.controlled["torch.multinomial"] += 1
        log.draws.append(Draw("torch.multinomial", dtype, rows.numel(), c, len(chosen),
                              outcome_probability=float(mass) if math.isfinite(float(mass)) else None))
        return result if input.dim() == 2 else result[0]

    # the watched and counted entry points

    def counting(self, owner, name, label):
        def fn(*args, **kwargs):
            self.log.uncontrolled[label] += 1
            return self.original(owner, name)(*args, **kwargs)
        return fn

    def poisoned(self, owner, name):
        def fn(*args, **kwargs):
            out = self.original(owner, name)(*args, **kwargs)
            # a tensor that requires grad, or one made while torch.compile traces or compiles (its
            # parameters, its fake tensors: a subject compiling on its first forced call), is the
            # compiler's, not the subject's uninitialised buffer: left as it is
            if not out.numel() or out.requires_grad or _compiling():
                return out
            return out.fill_(math.nan if out.dtype.is_floating_point else -1)
        return fn

    def reseeding(self, owner, name):
        entry = f"{owner.__name__}.{name}"

        def fn(*args, **kwargs):
            self.snapshot.look_again(entry)
            try:
                return self.original(owner, name)(*args, **kwargs)
            finally:
                self.snapshot.retake()  # where the reseed or restore left the sources
        return fn


@contextlib.contextmanager
def watched_randomness():
    """Observe, without forcing anything, which random sources outside the generator it was
    handed a subject draws from: torch's, numpy's and Python's global generators, and numpy
    generators seeded from OS entropy. Yields a list, filled when the block ends."""
    seen: list[str] = []
    log = DrawLog()
    saved = np.random.default_rng
    np.random.default_rng = _entropy_counter(log, np.random, "default_rng", _FRESH_ENTROPY)
    snapshot = RNGSnapshot()
    try:
        yield seen
    finally:
        np.random.default_rng = saved
        seen.extend(snapshot.moved())
        seen.extend(sorted(log.uncontrolled))
