"""Policies by name, composed into a stack: `castor+srtf`, typed parameters `srtf@360`, `castor:depth=64`.

Grammar: STACK = ITEM ('+' ITEM)*, ITEM = NAME ['@' SECONDS] (':' KEY '=' VALUE)*. Each name belongs to one
layer (placement and sharing, preemption, calibration, plan); a stack has at most one per layer and needs a
placement (a preemption policy alone brings a greedy placement in its own queue order). `@SECONDS` (or
`:interval=SECONDS`) runs the layer that owns the pass every SECONDS instead of on every event; only the
queue policies support it. Every combination that makes no sense is refused with one line saying why.

A NAME outside the table below is a policy from outside the repository (meshsched.policies.plugins): an entry
point of the group `meshsched.policies`, or `package.module:Class`. Models a policy needs come from the
`PolicyHandle` the caller passes (and its `Profiles`); the registry reads no file.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from meshsched.perf.interference import Interference
from meshsched.perf.model import PerfModel
from meshsched.perf.plans import PlanPerfModel
from meshsched.policies import plugins
from meshsched.policies.abilities import Preempts
from meshsched.policies.queue import Fifo, LeastAttained, QueueScheduler, ShortestJob, ShortestRemaining
from meshsched.policies.stack import PolicyHandle, PolicyStack

_CHOICES = {"loading": ("preempt", "spare", "last")}  # str parameters with a fixed set of values
MIN_INTERVAL = 1.0  # seconds; a shorter activation interval is a busy loop, not a policy


class UnknownPolicy(ValueError):
    pass


@dataclass(frozen=True)
class Param:
    name: str
    kind: type  # int, float or str
    help: str
    choices: tuple[str, ...] = ()  # the values a str parameter may take (empty: any)


@dataclass(frozen=True)
class Entry:
    layer: str  # "placement" | "preemption" | "calibration" | "plan"
    build: Callable[[dict, PolicyHandle], object]  # (typed parameters, handle) -> policy
    doc: str
    params: tuple[Param, ...] = ()
    needs_models: bool = False
    plan_models: bool = False  # allocates with the execution-plan model (replays plan-profile workloads)
    plan_build: Callable[[dict, PolicyHandle], object] | None = None  # builds it as a plan layer (another
    # placement holds the GPUs); a second placement name with this is the stack's plan layer


_INTERVAL = Param("interval", float, "seconds between activations (also written NAME@SECONDS)")


def _queue(name: str, order, **kw):
    def build(args: dict, handle: PolicyHandle):
        every = args.get("interval")
        return QueueScheduler(name if every is None else f"{name}@{every:g}", order() if callable(order) else order,
                              interval=every, **kw)
    return build


def _perf(h: PolicyHandle) -> PerfModel | PlanPerfModel | None:
    return h.perf if h.perf is not None or h.profiles is None else h.profiles.perf()


def _interference(h: PolicyHandle) -> Interference | None:
    return h.interference if h.interference is not None or h.profiles is None else h.profiles.interference()


def _no_profiles(what: str) -> ValueError:
    return ValueError(f"{what}: hand it in, or the profiles it comes from (PolicyHandle.profiles; "
                      "meshsched.loaders.profiles.installed_handle)")


def _sharing(cls, args: dict, h: PolicyHandle, *keys: str):
    return cls(perf=_perf(h), interference=_interference(h), one_user=h.one_user_per_gpu,
               **{k: args[k] for k in keys if k in args})


def _castor(args: dict, h: PolicyHandle):
    from meshsched.policies.castor import Castor

    return _sharing(Castor, args, h, "depth")


def _sjf_ffs(args: dict, h: PolicyHandle):
    from meshsched.policies.sharing_baselines import SjfFfs

    return _sharing(SjfFfs, args, h)


def _lucid(args: dict, h: PolicyHandle):
    from meshsched.policies.sharing_baselines import Lucid

    return _sharing(Lucid, args, h, "threshold")


def _gimbal(args: dict, h: PolicyHandle):
    from meshsched.policies.gimbal import LGRR_SWITCH_S, OBJECTIVES
    from meshsched.policies.gimbal_policy import GimbalCalibration

    name = args.get("objective", "jct")
    mps = h.mps_share
    if mps is None:
        if h.profiles is None:
            raise _no_profiles("gimbal needs the MPS-share model")
        mps = h.profiles.mps_share()
    return GimbalCalibration(OBJECTIVES[name], _perf(h), _interference(h), mps, args.get("switch", LGRR_SWITCH_S),
                             args.get("horizon", "drain") == "drain")


def _lazer(args: dict, h: PolicyHandle):
    from meshsched.policies.lazer import Lazer
    from meshsched.policies.lazer_opt import OptimizerConfig

    names = {"xmax": "high_s", "refit": "refit_every"}
    cfg = OptimizerConfig(seed=args.get("seed", h.seed), **{names[k]: v for k, v in args.items() if k in names})
    return Lazer(_perf(h), cfg, loading=args.get("loading", "last"))


def _plan_perf(h: PolicyHandle) -> PlanPerfModel:
    """The plan model the allocator predicts with: the handle's when it is one, else the profiles' A800 plans."""
    if isinstance(h.perf, PlanPerfModel):
        return h.perf
    if h.profiles is None:
        raise _no_profiles("the plan allocators need the execution-plan profiles")
    return PlanPerfModel(h.profiles.plan_catalog())


def _quotas(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in filter(None, text.split("/")):
        tenant, eq, gpus = part.partition("=")
        if not eq or not tenant.strip() or not gpus.strip().isdigit():
            raise UnknownPolicy(f"quotas are written TENANT=GPUS/TENANT=GPUS, got {text!r}")
        out[tenant.strip()] = int(gpus)
    return out


def _rubick(args: dict, h: PolicyHandle):
    from meshsched.policies.rubick import VARIANTS, Rubick

    variant = args.get("variant", "full")
    name = "rubick" if variant == "full" else f"rubick-{variant}"
    return Rubick(_plan_perf(h), VARIANTS[variant], _quotas(args.get("quotas", "")), name)


def _rubick_plan(args: dict, h: PolicyHandle):
    from meshsched.policies.rubick_plan import RubickPlans

    plans = getattr(h.perf, "plans", None)  # a mixed model (meshsched.perf.mixed) carries its plan model
    return RubickPlans(plans if isinstance(plans, PlanPerfModel) else _plan_perf(h),
                       models=getattr(h.perf, "planned_models", None))


def _plan_baseline(knobs_name: str):
    def build(args: dict, h: PolicyHandle):
        from meshsched.policies import rubick_baselines
        from meshsched.policies.rubick import Rubick

        return Rubick(_plan_perf(h), getattr(rubick_baselines, knobs_name.upper()), {}, f"{knobs_name}-like")
    return build


POLICIES: dict[str, Entry] = {
    "rubick": Entry("placement", _rubick,
                    "Rubick: allocates GPUs, CPUs and memory by resource-sensitivity slope and picks each job's "
                    "execution plan (Alg. 1); guaranteed jobs keep their asked performance within tenant quotas",
                    (Param("variant", str, "full (default), e (plans only), r (resources only), n (neither)",
                           ("full", "e", "r", "n")),
                     Param("quotas", str, "guaranteed GPUs per tenant, TENANT=GPUS/TENANT=GPUS (default: none)")),
                    plan_models=True, plan_build=_rubick_plan),
    "sia": Entry("placement", _plan_baseline("sia"),
                 "Sia-like: elastic GPUs along the data-parallel size of the asked plan, CPUs as asked (Rubick's "
                 "baseline)", plan_models=True),
    "synergy": Entry("placement", _plan_baseline("synergy"),
                     "Synergy-like: asked GPUs and plan, CPUs and memory tuned to the plan, FIFO with backfill "
                     "(Rubick's baseline)", plan_models=True),
    "fifo": Entry("placement", _queue("fifo", Fifo, strict=True),
                  "first come first served, head-of-line blocking, non-preemptive", (_INTERVAL,)),
    "sjf": Entry("placement", _queue("sjf", ShortestJob), "shortest expected duration first, backfills, non-preemptive",
                 (_INTERVAL,)),
    "sjf-strict": Entry("placement", _queue("sjf-strict", ShortestJob, strict=True),
                        "SJF without backfilling: stops at the first queued job that does not fit (Lucid's sjf)",
                        (_INTERVAL,)),
    "srtf": Entry("preemption", _queue("srtf", ShortestRemaining, preemptive=True),
                  "shortest remaining time first, preempts on every arrival and release", (_INTERVAL,)),
    "las": Entry("preemption", _queue("las", LeastAttained, preemptive=True),
                 "Tiresias-style 2D-LAS: least attained GPU-time first, preemptive, needs no duration", (_INTERVAL,)),
    "lazer": Entry("preemption", _lazer,
                   "Lazer: SRTF on every arrival and release, each preemption deferred by X s chosen by Bayesian "
                   "optimisation to avoid futile preemptions",
                   (Param("refit", int, "refit the GP after this many new observations (default 5)"),
                    Param("xmax", float, "the longest deferral X in seconds (default 100)"),
                    Param("seed", int, "the optimiser's seed (default: the run's seed)"),
                    Param("loading", str, "a job still loading: last (the default: only if the others do not suffice, "
                          "after the running jobs that have not yet trained as long as their load took), preempt "
                          "(the paper: like any other) or spare (never)")),
                   True),
    "castor": Entry("placement", _castor,
                    "Castor SJF-BSBF: SJF; shares a single-job GPU only when the pair's mean JCT beats waiting",
                    (Param("depth", int, "queued jobs given the sharing search on a release (default 64)"),), True),
    "sjf-ffs": Entry("placement", _sjf_ffs, "SJF with first-fit GPU sharing whenever free GPUs are short", (), True),
    "lucid": Entry("placement", _lucid,
                   "Lucid-like: shares only equal-size jobs whose combined profiled utilisation stays <= 1",
                   (Param("threshold", float, "combined utilisation limit (default 1.0)"),), True),
    "gimbal": Entry("calibration", _gimbal,
                    "Gimbal: calibrates the jobs sharing GPUs (MPS share via LGRR, per-rank samples via LISS), Alg. 1",
                    (Param("objective", str, "jct (default), deadline or makespan", ("jct", "deadline", "makespan")),
                     Param("switch", float, "seconds an LGRR switch costs (default 3.6, the paper's)"),
                     Param("horizon", str, "remaining time as the set drains (drain, default) or at today's "
                           "throughput until each job ends (static, the paper's eq. 1)", ("drain", "static"))), True),
}

# A preemption policy alone runs over a greedy placement in its own queue order.
_COMPANION = {
    "srtf": _queue("srtf", ShortestRemaining),
    "las": _queue("las", LeastAttained),
    "lazer": _queue("lazer", ShortestRemaining),
}


def _known() -> str:
    return ", ".join(sorted({*POLICIES, *plugins.installed_names()}))


def _entry(name: str) -> Entry:
    """The table's entry for `name`, else the policy from outside it names (entry point or `pkg.mod:Class`)."""
    entry = POLICIES.get(name)
    if entry is not None:
        return entry
    try:
        cls = plugins.find(name)
        if cls is None:
            raise UnknownPolicy(f"unknown policy {name!r}; known: {_known()} (combine with +, add @SECONDS for "
                                "periodic)")
        layer = plugins.layer_of(name, cls)
    except plugins.PluginRefused as exc:
        raise UnknownPolicy(str(exc)) from None

    def build(args: dict, handle: PolicyHandle):
        try:
            return plugins.build(name, cls, layer, handle)
        except plugins.PluginRefused as exc:
            raise UnknownPolicy(str(exc)) from None

    return Entry(layer, build, (cls.__doc__ or "").strip().partition("\n")[0])


def _split_item(item: str) -> tuple[str, dict[str, str]]:
    """(name, raw parameters) of one stack item; a name `pkg.mod:Class` keeps its colon."""
    head, *pairs = item.split(":")
    name, at, every = head.partition("@")
    name = name.strip()
    if name not in POLICIES and plugins.is_import_path(name, pairs):
        name = f"{name}:{pairs.pop(0).strip()}"
    raw: dict[str, str] = {}
    if at:
        raw["interval"] = every.strip()
    for pair in pairs:
        key, eq, value = pair.partition("=")
        key = key.strip()
        if not eq or not key:
            raise UnknownPolicy(f"policy {item!r}: parameters are written {name}:KEY=VALUE, got {pair!r}")
        if key in raw:
            raise UnknownPolicy(f"policy {item!r}: {key} given twice")
        raw[key] = value.strip()
    return name, raw


def _parse_item(item: str) -> tuple[str, dict]:
    name, raw = _split_item(item)
    entry = _entry(name)
    kinds = {p.name: p for p in entry.params}
    args: dict = {}
    for key, value in raw.items():
        param = kinds.get(key)
        if param is None:
            if key == "interval":
                raise UnknownPolicy(f"policy {item!r}: {name} runs on every event and has no periodic mode "
                                    f"(@SECONDS works with {', '.join(n for n, e in POLICIES.items() if _INTERVAL in e.params)})")
            known = ", ".join(p.name for p in entry.params) or "none"
            raise UnknownPolicy(f"policy {item!r}: {name} has no parameter {key!r} (parameters: {known})")
        try:
            v = param.kind(value)
        except ValueError:
            what = "seconds" if key == "interval" else param.kind.__name__
            raise UnknownPolicy(f"policy {item!r}: {key} must be {what}, got {value!r}") from None
        if key == "interval" and not MIN_INTERVAL <= v < math.inf:
            raise UnknownPolicy(f"policy {item!r}: the interval must be a finite number of seconds >= {MIN_INTERVAL:g}")
        if param.choices and v not in param.choices:
            raise UnknownPolicy(f"policy {item!r}: {key} must be one of {', '.join(param.choices)}, got {value!r}")
        if param.kind in (int, float) and key != "interval" and not (v > 0 and math.isfinite(v)):
            raise UnknownPolicy(f"policy {item!r}: {key} must be a positive number, got {value!r}")
        if key == "quotas":
            _quotas(v)  # checked here, so that a bad value is one line at parse time
        if key in _CHOICES and v not in _CHOICES[key]:
            raise UnknownPolicy(f"policy {item!r}: {key} must be one of {', '.join(_CHOICES[key])}, got {value!r}")
        args[key] = v
    return name, args


def make_policy(spec: str, handle: PolicyHandle | None = None) -> PolicyStack:
    """Build a fresh stack from its description, e.g. `srtf`, `srtf@360`, `castor+srtf`, `castor:depth=32`.

    `handle` hands in the models (at construction, never inside a scheduling pass); the default has none, so a
    policy that needs one is refused (ValueError): meshd, `mesh simulate` and tests pass
    `meshsched.loaders.profiles.installed_handle()`, whose profiles supply each model on demand."""
    text = spec.strip()
    layers = parse_policy(text)
    preempt = layers.get("preemption")
    handle = PolicyHandle() if handle is None else handle
    built = {layer: _builder(layer, n)(args, handle) for layer, (n, args) in layers.items()}
    placement = built.get("placement")
    if placement is None:
        placement = _COMPANION[preempt[0]]({}, handle)
    _weigh_preemption(placement, built.get("preemption"))
    return PolicyStack(text, placement, built.get("preemption"), built.get("calibration"), built.get("plan"))


def _weigh_preemption(placement, preemption) -> None:
    """Castor over a preemption layer that evicts longer jobs for a shorter one on every pass (srtf, lazer; not a
    periodic one) weighs that start against sharing (castor_preempt)."""
    from meshsched.policies.castor import Castor

    order = getattr(preemption, "order", None)
    evicts = getattr(preemption, "preemptive", True) and getattr(preemption, "interval", None) is None
    if isinstance(placement, Castor) and isinstance(order, ShortestRemaining) and evicts:
        placement.preemption_order = order


def _builder(layer: str, name: str):
    entry = _entry(name)
    return entry.plan_build if layer == "plan" and entry.layer != "plan" else entry.build


def _plan_layer(spec: str, layers: dict, name: str, entry: Entry) -> str:
    """The layer `name` takes beside `layers`: its own, or the plan layer when another placement holds the GPUs
    (rubick after castor); a placement that can plan and came first moves to the plan layer instead."""
    if entry.layer != "placement" or "placement" not in layers or "plan" in layers:
        return entry.layer
    if entry.plan_build is not None:
        return "plan"
    held = layers["placement"][0]
    if _entry(held).plan_build is not None:
        layers["plan"] = layers.pop("placement")
    return entry.layer


def parse_policy(spec: str) -> dict[str, tuple[str, dict]]:
    """Check a stack description without building it: {layer: (name, typed parameters)}; UnknownPolicy if bad."""
    text = spec.strip()
    if not text:
        raise UnknownPolicy(f"empty policy; known: {_known()}")
    layers: dict[str, tuple[str, dict]] = {}
    for item in text.split("+"):
        if not item.strip():
            raise UnknownPolicy(f"policy {spec!r}: empty item around '+'")
        name, args = _parse_item(item.strip())
        layer = _plan_layer(spec, layers, name, _entry(name))
        if layer in layers:
            raise UnknownPolicy(f"policy {spec!r}: {layers[layer][0]} and {name} are both {layer} policies; a stack "
                                f"takes one per layer")
        layers[layer] = (name, args)
    place = layers.get("placement")
    if place is not None and "preemption" in layers and "plan" not in layers and _entry(place[0]).plan_build:
        layers["plan"] = layers.pop("placement")  # lazer+rubick: plans over the preemption layer's own placement
    _check_layers(spec, layers)
    return layers


def _check_layers(spec: str, layers: dict[str, tuple[str, dict]]) -> None:
    place, preempt = layers.get("placement"), layers.get("preemption")
    if place is None and preempt is None:
        raise UnknownPolicy(f"policy {spec!r}: a stack needs a placement or preemption policy ({_known()})")
    plan = layers.get("plan")
    if plan is not None and place is not None and _entry(place[0]).plan_models:
        raise UnknownPolicy(f"policy {spec!r}: {place[0]} picks execution plans itself; {plan[0]} as a plan layer "
                            f"goes over a placement that does not (castor+{plan[0]})")
    if place is None and preempt[0] not in _COMPANION:
        raise UnknownPolicy(f"policy {spec!r}: {preempt[0]} brings no placement of its own; write PLACEMENT+{preempt[0]}")
    if place is not None and preempt is not None:
        if place[0] == "fifo":
            raise UnknownPolicy(f"policy {spec!r}: fifo is strict first-come-first-served; preempting by "
                                f"{preempt[0]}'s priority contradicts it (use {preempt[0]} alone)")
        if not _entry(place[0]).needs_models:
            raise UnknownPolicy(f"policy {spec!r}: {place[0]}'s queue order is replaced by {preempt[0]}'s, so the "
                                f"stack is {preempt[0]} alone (write {preempt[0]})")
        if "interval" in place[1]:
            raise UnknownPolicy(f"policy {spec!r}: only the layer that owns the pass ({preempt[0]}) may be periodic")


def needs_models(spec: str) -> bool:
    """Whether a stack needs the interference predictor and the other models (the sharing policies do)."""
    return any(_entry(n).needs_models for n, _ in parse_policy(spec).values())


def needs_plan_models(spec: str) -> bool:
    """Whether a stack allocates with the execution-plan model (rubick, sia, synergy)."""
    return any(_entry(n).plan_models for layer, (n, _) in parse_policy(spec).items() if layer != "plan")


def has_plan_layer(spec: str) -> bool:
    """Whether a stack has a plan layer (rubick after another placement): it replays a mixed workload."""
    return "plan" in parse_policy(spec)


def stack_of(policy) -> PolicyStack:
    """A stack around one hand-built queue policy (tests, benchmarks): a preemptive one owns the pass over a
    greedy placement in its own order."""
    if isinstance(policy, PolicyStack):
        return policy
    if isinstance(policy, Preempts) and policy.preemptive:
        return PolicyStack(policy.name, QueueScheduler(policy.name, policy.order), policy)
    return PolicyStack(policy.name, policy)
