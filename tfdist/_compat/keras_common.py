"""Private parts that Keras 3 and tf_keras share and tfdist reaches: layers in order, optimizer state, strategy.

Checked on Keras 3.5.0 and 3.15.1, tf_keras 2.17.0 and 2.21.0.
"""

from __future__ import annotations

from typing import Any

from tfdist._compat import private


def sublayers(model: Any) -> list:
    """Every layer inside ``model``, depth first, in the order they were built; not ``model`` itself.

    Reaches ``Layer._flatten_layers(include_self=False)``, in both Keras. The public
    ``model.layers`` lists the top level only, and the order is what keys per-layer state.
    """
    return list(private(model, "_flatten_layers", "keras_common.sublayers")(include_self=False))


def owning_strategy(model: Any) -> Any:
    """The strategy ``model``'s variables were made in; None when none was in scope, and for an
    object that is no Keras model (a function that builds one).

    Reaches ``_distribute_strategy`` (Keras 3's Trainer) or ``_distribution_strategy``
    (tf_keras' Model). The public ``distribute_strategy`` falls back to the current strategy,
    so it cannot tell "made in none" from "made in this one".
    """
    if not hasattr(type(model), "distribute_strategy"):
        return None
    for name in ("_distribute_strategy", "_distribution_strategy"):
        if hasattr(model, name):
            return getattr(model, name)
    return private(model, "_distribute_strategy", "keras_common.owning_strategy")


def weight_decay_exclusions(optimizer: Any) -> tuple[set, list[str]]:
    """(variable keys, name patterns) that ``optimizer.exclude_from_weight_decay`` was given.

    Reaches ``_exclude_from_weight_decay`` and ``_exclude_from_weight_decay_pattern`` (Keras 3)
    or ``_exclude_from_weight_decay_names`` (tf_keras). The optimizer's config leaves them out.
    Both Keras create them only when the method is called: absent, nothing was excluded.
    """
    keys = set(getattr(optimizer, "_exclude_from_weight_decay", None) or ())
    pattern = getattr(optimizer, "_exclude_from_weight_decay_pattern", None)  # Keras 3: the names, as one regex
    names = [pattern.pattern] if pattern is not None else list(getattr(optimizer, "_exclude_from_weight_decay_names",
                                                                       None) or [])
    return keys, names


def variable_key(optimizer: Any, variable: Any) -> Any:
    """The key ``optimizer`` files ``variable`` under (what :func:`weight_decay_exclusions` holds).

    Reaches ``Optimizer._var_key``, in both Keras; its form differs between them.
    """
    return private(optimizer, "_var_key", "keras_common.variable_key")(variable)


def optimizer_builder(optimizer: Any) -> Any:
    """The method that creates ``optimizer``'s variables from a variable list, or None if it has none.

    Keras 3 and tf_keras' optimizers have the public ``build``. A tf_keras legacy optimizer has
    only ``_create_all_weights``, which makes iterations, hyper-parameters and slots.
    """
    build = getattr(optimizer, "build", None)
    if build is not None:
        return build
    return getattr(optimizer, "_create_all_weights", None)


def optimizer_built(optimizer: Any) -> bool:
    """Whether ``optimizer`` has made its variables: public ``built``, or a legacy one's ``_built``."""
    return bool(getattr(optimizer, "built", False) or getattr(optimizer, "_built", False))


def learning_rate_candidates(optimizer: Any) -> list:
    """What may hold ``optimizer``'s learning rate: ``_learning_rate`` (Keras 3, tf_keras) and a
    legacy optimizer's ``_hyper["learning_rate"]``; the caller keeps what is a variable.

    The public ``learning_rate`` property returns a value, not the variable that a restore sets.
    Either attribute may be absent: each Keras has one of them.
    """
    return [getattr(optimizer, "_learning_rate", None), getattr(optimizer, "_hyper", {}).get("learning_rate")]
