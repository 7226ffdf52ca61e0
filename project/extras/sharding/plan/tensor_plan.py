"""``parallel.tensor_parallel.plan`` resolved against the built model: which module is split how, or why not.

Pure (no process group): the ranks apply the result (:mod:`project.extras.sharding.tensor_parallel`), ``plan`` shows it
and counts what it divides. Styles, in Megatron's terms: ``colwise`` splits a Linear's output features (each rank
computes its slice), ``rowwise`` its input features (each rank a partial sum, all-reduced). A ``colwise`` Linear
feeds a ``rowwise`` one, with only element-wise modules between: one all-reduce per pair in the forward, one in the
backward. ``sequence`` (a norm or dropout on a slice of the sequence) is refused: it is right only when the
residual stream around it is sharded along the sequence too, which a pattern cannot say; a module's own
``parallelize(mesh)`` can apply torch's ``SequenceParallel`` with its neighbours' layouts.

``auto`` knows the template's GPT (the gpt layer's: attention ``q_proj``/``k_proj``/``v_proj`` colwise,
``out_proj`` rowwise; MLP ``up`` colwise, ``down`` rowwise) and, in any ``nn.Sequential``, a Linear followed by
element-wise modules and a second Linear. A module with a ``parallelize(mesh)`` method parallelizes itself.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping

from torch import nn

from project.errors import UserError
from project.extras.sharding.fsdp.units import tied_outside

#: Modules that act on each feature alone: a colwise Linear's slice of features passes through them unchanged.
ELEMENTWISE = (nn.ReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.LeakyReLU, nn.ELU, nn.Mish, nn.Dropout, nn.Identity)
#: The template GPT's attention and MLP children, by name.
NAMED_PAIRS = (
    {"q_proj": "colwise", "k_proj": "colwise", "v_proj": "colwise", "out_proj": "rowwise"},
    {"up": "colwise", "down": "rowwise"},
)
#: What a module's own ``parallelize(mesh)`` method is shown as in the plan.
HOOK = "parallelize(mesh)"


def hook_modules(model: nn.Module) -> list[str]:
    """Names of the modules (``""``: the model itself) that bring their own ``parallelize(mesh)`` method."""
    return [name for name, module in model.named_modules() if callable(getattr(module, "parallelize", None))]


def _auto(model: nn.Module) -> dict[str, str]:
    """The styles ``auto`` finds: the GPT's named children, and Linear pairs in sequential containers."""
    styles: dict[str, str] = {}
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        children = dict(module.named_children())
        for pair in NAMED_PAIRS:
            if all(isinstance(children.get(child), nn.Linear) for child in pair):
                styles.update({f"{prefix}{child}": style for child, style in pair.items()})
        if isinstance(module, nn.Sequential):
            styles.update(_sequential_pairs(prefix, list(children.items())))
    return styles


def _sequential_pairs(prefix: str, children: list[tuple[str, nn.Module]]) -> dict[str, str]:
    """In one ``nn.Sequential``: each Linear, element-wise modules, Linear run becomes colwise, rowwise."""
    styles: dict[str, str] = {}
    i = 0
    while i < len(children):
        if isinstance(children[i][1], nn.Linear):
            j = i + 1
            while j < len(children) and isinstance(children[j][1], ELEMENTWISE):
                j += 1
            if j < len(children) and isinstance(children[j][1], nn.Linear):
                styles[prefix + children[i][0]] = "colwise"
                styles[prefix + children[j][0]] = "rowwise"
                i = j + 1
                continue
        i += 1
    return styles


def _from_patterns(model: nn.Module, patterns: Mapping[str, str]) -> dict[str, str]:
    """The styles of a user's mapping; a pattern that matches no module is refused."""
    names = [name for name, _ in model.named_modules() if name]
    styles: dict[str, str] = {}
    for pattern, style in patterns.items():
        if style == "sequence":
            raise UserError(
                f"parallel.tensor_parallel.plan[{pattern!r}]='sequence' is not built: sequence parallelism is right "
                "only when the layers around it hand over activations sharded along the sequence, which a pattern "
                "cannot say; split Linear layers colwise/rowwise, or give the module a parallelize(mesh) method "
                "that applies torch's SequenceParallel with its neighbours' layouts"
            )
        if style not in ("colwise", "rowwise"):
            raise UserError(f"parallel.tensor_parallel.plan[{pattern!r}]={style!r} is not one of colwise, rowwise")
        matched = [name for name in names if fnmatch.fnmatchcase(name, pattern)]
        if not matched:
            example = ", ".join(names[:4])
            raise UserError(
                f"parallel.tensor_parallel.plan pattern {pattern!r} matches no module of {type(model).__name__}; "
                f"patterns match module names such as {example} (fnmatch: * matches any characters)"
            )
        styles.update(dict.fromkeys(matched, style))
    return styles


def _check_divisible(model: nn.Module, styles: Mapping[str, str], tp: int) -> None:
    """Each split Linear (or Embedding) has a multiple of ``tp`` features, and each split attention of heads."""
    modules = dict(model.named_modules())
    for name, style in styles.items():
        module = modules[name]
        if not isinstance(module, (nn.Linear, nn.Embedding)):
            raise UserError(
                f"parallel.tensor_parallel.plan splits {name} ({type(module).__name__}) {style}; colwise and "
                "rowwise split nn.Linear and nn.Embedding only: match those modules, or give the module a "
                "parallelize(mesh) method"
            )
        size, what = _split_size(module, style)
        if size % tp:
            raise UserError(
                f"{name} has {size} {what}, not divisible by parallel.tensor_parallel.size={tp}; use a size that "
                f"divides {size}"
            )
    for name, module in modules.items():
        heads = getattr(module, "n_head", None)
        prefix = f"{name}." if name else ""
        if isinstance(heads, int) and styles.get(f"{prefix}q_proj") == "colwise" and heads % tp:
            raise UserError(
                f"{name or type(model).__name__} has n_head={heads} attention heads, not divisible by "
                f"parallel.tensor_parallel.size={tp}; use a size that divides {heads}"
            )


def _split_size(module: nn.Module, style: str) -> tuple[int, str]:
    """The dimension ``style`` splits, and its name for messages."""
    if isinstance(module, nn.Embedding):
        return (module.embedding_dim, "embedding features") if style == "colwise" else (module.num_embeddings, "rows")
    if style == "colwise":
        return module.out_features, "output features"
    return module.in_features, "input features"


def resolve_tensor_plan(model: nn.Module, plan: str | Mapping[str, str], tp: int) -> dict[str, str]:
    """Module name -> style for ``model`` at tensor-parallel degree ``tp`` (``{name: HOOK}`` for a hook).

    Raises:
        UserError: a pattern that matches nothing, an unknown style, a module that cannot be split so, a size
            or head count ``tp`` does not divide, or ``auto`` finding nothing to split.
    """
    hooks = hook_modules(model)
    if hooks and plan == "auto":
        return dict.fromkeys(hooks, HOOK)
    if isinstance(plan, str):
        if plan != "auto":
            raise UserError(
                f"parallel.tensor_parallel.plan={plan!r} must be 'auto' or a mapping of module-name patterns "
                "to colwise or rowwise"
            )
        styles = _auto(model)
        if not styles:
            raise UserError(
                f"parallel.tensor_parallel.plan 'auto' found nothing to split in {type(model).__name__} (no "
                "Linear pair with only element-wise modules between them); give a mapping of module-name "
                "patterns to colwise/rowwise, or a parallelize(mesh) method"
            )
    else:
        styles = _from_patterns(model, plan)
    _check_divisible(model, styles, tp)
    _refuse_tied(model, styles)
    return styles


def _refuse_tied(model: nn.Module, styles: Mapping[str, str]) -> None:
    """A module split over the ranks whose weight is tied to one outside it: the two would no longer be one weight."""
    for name, style in styles.items():
        if style != HOOK and tied_outside(model.get_submodule(name), [model]):
            raise UserError(
                f"parallel.tensor_parallel splits {name} ({style}), whose weight is tied to a module outside it "
                "(tied embeddings): split, it would train apart from its tie; leave it out of the plan, or untie it"
            )


def split_parameter_names(model: nn.Module, styles: Mapping[str, str]) -> set[str]:
    """The parameters a resolved plan divides over the tensor-parallel ranks (a hook's: all of its module's)."""
    modules = dict(model.named_modules())
    names: set[str] = set()
    for name, style in styles.items():
        prefix = f"{name}." if name else ""
        params = [param for param, _ in modules[name].named_parameters()]
        if style == "rowwise" and isinstance(modules[name], nn.Linear):
            params = ["weight"]  # a rowwise Linear's bias is added once, after the all-reduce: replicated
        names.update(prefix + param for param in params)
    return names
