"""``tfdist.evaluate`` and ``tfdist.predict``: a trained model's loss and metrics, or its outputs,
on data, every example once, under the strategy the model was built in.

After a multi-worker ``fit``, Keras 3's own ``model.evaluate`` fails (it cannot convert the
replicas' ``PerReplica`` outputs); tf_keras' evaluates, but cannot read tfdist's sources. This
runs what ``fit`` runs after each epoch, on its own: the same sharded input (replica ``r`` of
``M`` evaluates the ``r``-th ``1/M`` of the examples) and the same test function, so it returns
the metrics the last epoch's validation reported for the same data and batch size. ``predict``
reads the same input and gathers every replica's outputs, in the order of the examples, on
every task. (The sidecar that evaluates each checkpoint as it appears is ``evaluator``.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any, Sequence

from tfdist import _logs
from tfdist import data as data_mod
from tfdist import strategy as strategy_mod
from tfdist.cluster import ClusterSpec, detect
from tfdist.errors import DataError
from tfdist.training.keras_common import LastModelCache, keras_of
from tfdist.training.model import adapter_for
from tfdist.training.run import verbosity

log = logging.getLogger("tfdist")

__all__ = ["evaluate", "image_size_of", "predict"]

_ON_CHIEF = LastModelCache()  # the test function of the model the chief evaluated last
_PREDICT = LastModelCache()  # the predict function of the model that predicted last


@_logs.shows_logs
def evaluate(
    model: Any,
    data: Any,
    y: Any = None,
    *,
    batch_size: int | None = None,
    per_replica_batch_size: int | None = None,
    callbacks: Sequence[Any] | None = None,
    verbose: int | str = "auto",
    cluster: ClusterSpec | None = None,
) -> dict[str, float]:
    """Evaluates a compiled Keras 3 or tf_keras ``model`` on ``data``, every example once.

    ``model`` is typically ``fit``'s ``history.model``. It runs under the strategy it was built in,
    each replica on its own part of the data. Call it on every task that trained, as ``fit`` is.
    Under multi_worker_mirrored every worker gets the same result. Under parameter servers the
    chief evaluates alone.

    Args:
      model: A compiled Keras 3 or tf_keras model, such as ``history.model``, or one loaded from
        its file inside a strategy's scope.
      data: Any form ``fit`` takes. A string is read as ``tfdist evaluate --data`` reads it: a
        named data set gives its held-out split, and a folder gives every image at the model's
        input size. A ``sample_weight`` in the data weighs each example.
      y: The labels, as in Keras' ``evaluate(x, y)``. Defaults to None: the labels are in ``data``.
      batch_size: The global batch. Give this or ``per_replica_batch_size``. Defaults to None:
        32 per replica.
      per_replica_batch_size: One replica's batch. Defaults to None.
      callbacks: Callbacks of the model's Keras. They get the ``on_test_*`` calls of Keras'
        ``evaluate``. Defaults to None.
      verbose: 0 (silent), 1 (progress bar) or 2. Only the chief prints. Defaults to ``"auto"``.
      cluster: This task's [`ClusterSpec`][tfdist.ClusterSpec]. Defaults to None: detected, as
        ``fit`` does.

    Returns:
      ``{name: value}``: the loss and every metric, as Keras' ``evaluate(..., return_dict=True)``.
        With the batch the run validated with, it equals the last epoch's ``val_`` numbers.

    Raises:
      DataError: The data has no labels, or cannot be read.
      ModelError: The model is not compiled.
      BatchSizeError: The batch does not divide into the replicas.

    Examples:
        ```python
        import keras
        import tfdist

        model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        history = tfdist.fit(model, "digits", epochs=2, batch_size=64, seed=0)
        print(tfdist.evaluate(history.model, "digits"))   # {'accuracy': ..., 'loss': ...}
        ```
    """
    if y is not None:
        data = data_mod.with_labels(data, y)
    run = _Inference.of(model, data, use="evaluate", batch_size=batch_size,
                        per_replica_batch_size=per_replica_batch_size, verbose=verbose, cluster=cluster)
    data_mod.check_labelled(run.source, use="evaluate")
    run.adapter.prepare_evaluation(model, sample=run.source.sample(run.sizes.micro_batch_size))  # e.g. just loaded
    callbacks = list(callbacks or ())
    with run.own_errors():
        dataset, steps = run.input()
        if run.on_chief:
            logs = _on_chief(model, dataset, steps, callbacks, run.verbose)
        else:
            logs = run.adapter.evaluate(model, dataset, steps=steps, callbacks=callbacks, verbose=run.verbose)
    return {key: float(value) for key, value in logs.items()}


@dataclasses.dataclass(frozen=True)
class _Inference:
    """What ``evaluate`` and ``predict`` share: the model's strategy and adapter, the source, the
    batch sizes, this task's verbosity."""

    strategy: strategy_mod.Strategy
    adapter: Any
    traits: strategy_mod.Traits
    source: Any
    sizes: data_mod.BatchSizes
    verbose: int

    @classmethod
    def of(cls, model, data, *, use, batch_size, per_replica_batch_size, verbose, cluster) -> "_Inference":
        adapter = adapter_for(model, getattr(model, "distribute_strategy", None), use=use)  # every Keras model has one
        adapter.check(model, use=use)
        cluster = detect() if cluster is None else cluster
        strategy = adapter.strategy
        sizes = data_mod.BatchSizes.resolve(num_replicas=strategy.num_replicas_in_sync, batch_size=batch_size,
                                            per_replica_batch_size=per_replica_batch_size)
        source = _source(data, model)
        _check_fits(model, source)
        return cls(strategy=strategy, adapter=adapter, traits=strategy.traits_in(cluster),
                   source=source, sizes=sizes, verbose=verbosity(verbose, cluster))

    @property
    def on_chief(self) -> bool:
        """Under parameter servers the chief reads every example itself (the variables stay on the ps tasks)."""
        return self.traits.coordinated

    def input(self) -> tuple:
        """``(dataset, steps)``: the chief's own batches, or fit's validation input (each replica its part)."""
        if self.on_chief:
            log.info("inference on the chief: %d examples in batches of %d (parameter_server: the workers are "
                     "not used)",
                     self.source.num_examples or 0, self.sizes.global_batch_size)
            dataset = data_mod.validation_dataset(self.source, self.sizes.global_batch_size)
            steps = int(dataset.cardinality())
            return dataset, steps if steps >= 0 else None
        log.info("inference under %s: %s", self.traits.name, self.sizes.describe())
        return data_mod.validation_input(self.source, self.sizes, strategy=self.strategy)

    @contextlib.contextmanager
    def own_errors(self):
        """The user's error behind TensorFlow's from the input pipeline (``data.read_failure``: a
        Python dataset's own exception, the damaged file named), not TensorFlow's wrapping of it."""
        try:
            yield
        except BaseException as e:
            failure = data_mod.read_failure(e, self.source)
            if failure is not None:
                raise failure from None
            raise


def _source(data: Any, model):
    """The source to evaluate: for a name or a path, what ``data.load_to_evaluate`` reads (a folder's
    images at the model's input size), else the data itself."""
    if not isinstance(data, str):
        return data_mod.as_source(data)
    source = data_mod.load_to_evaluate(data, model_image_size=image_size_of(model))
    log.info("%s examples of %s", source.num_examples, data)
    return source


def _check_fits(model, source) -> None:
    """Refuses, before TensorFlow fails inside the model, examples whose shape a model with one
    declared input cannot take (Keras adds or drops a last dimension of 1 itself)."""
    import numpy as np
    import tensorflow as tf

    inputs = getattr(model, "inputs", None) or []
    if len(inputs) != 1 or not source.num_examples:
        return
    arrays = tf.nest.flatten(data_mod.inputs_of(source.sample(1)))
    if len(arrays) != 1:
        return
    declared, given = tuple(inputs[0].shape)[1:], tuple(np.shape(arrays[0]))[1:]
    want, got = declared, given
    if len(want) == len(got) + 1 and want[-1] == 1:
        want = want[:-1]
    elif len(got) == len(want) + 1 and got[-1] == 1:
        got = got[:-1]
    if len(want) != len(got) or any(w is not None and w != g for w, g in zip(want, got)):
        raise DataError(f"the examples do not fit the model: its input takes examples of shape {declared}; "
                        f"received examples of shape {given}. "
                        "Fix: pass data shaped as the data the model was trained on (images: --image-size, "
                        "image_size=).")


def image_size_of(model) -> tuple[int, int] | None:
    """(height, width) of a model with one image input (batch, height, width, channels), else None."""
    inputs = getattr(model, "inputs", None) or []
    shape = tuple(inputs[0].shape) if len(inputs) == 1 else ()
    if len(shape) == 4 and all(isinstance(side, int) for side in shape[1:3]):
        return (shape[1], shape[2])
    return None


def _on_chief(model, dataset, steps: int | None, callbacks: list, verbose: int) -> dict:
    """Keras 3 and tf_keras alike: the model's ``test_step`` over ``dataset`` in this process
    (under parameter servers its variables are read from the ps tasks), with Keras' callbacks."""
    import tensorflow as tf

    keras = keras_of(model)
    callback_list = keras.callbacks.CallbackList(callbacks, add_progbar=verbose != 0, model=model, verbose=verbose,
                                                 epochs=1, steps=steps)
    test = _ON_CHIEF.get(model, lambda: tf.function(model.test_step, reduce_retracing=True, autograph=False))
    model.reset_metrics()
    callback_list.on_test_begin()
    logs: dict = {}
    for i, batch in enumerate(dataset):
        callback_list.on_test_batch_begin(i)
        logs = test(batch)
        callback_list.on_test_batch_end(i, logs)
    logs = {key: float(value) for key, value in logs.items()}
    callback_list.on_test_end(logs)
    return logs


@_logs.shows_logs
def predict(
    model: Any,
    x: Any,
    *,
    batch_size: int | None = None,
    per_replica_batch_size: int | None = None,
    verbose: int | str = "auto",
    cluster: ClusterSpec | None = None,
) -> Any:
    """Computes the outputs of a Keras 3 or tf_keras ``model`` for every example of ``x``, in order.

    Like [`evaluate`][tfdist.evaluate], it runs under the strategy the model was built in, each
    replica on its own part of the examples. The replicas' outputs are gathered in order. Call it
    on every task that trained, as ``fit`` is. Under multi_worker_mirrored every worker gets all
    the outputs. Under parameter servers the chief predicts alone.

    Args:
      model: A Keras 3 or tf_keras model, compiled or not, such as ``history.model``.
      x: The inputs, as Keras' ``predict(x)`` takes them: an array, or a dict, list or tuple of
        arrays. Or a source or name that ``evaluate`` takes, whose labels are not used. A folder's
        name reads every image under it, with or without class subfolders.
      batch_size: The global batch. Give this or ``per_replica_batch_size``. Defaults to None:
        32 per replica.
      per_replica_batch_size: One replica's batch. Defaults to None.
      verbose: 0 (silent), 1 (progress bar) or 2. Only the chief prints. Defaults to ``"auto"``.
      cluster: This task's [`ClusterSpec`][tfdist.ClusterSpec]. Defaults to None: detected, as
        ``fit`` does.

    Returns:
      The outputs as NumPy arrays, one row per example: one array per output, as Keras'
        ``predict`` returns them.

    Raises:
      DataError: The inputs cannot be read.
      BatchSizeError: The batch does not divide into the replicas.

    Examples:
        ```python
        import keras
        import numpy as np
        import tfdist

        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        outputs = tfdist.predict(model, np.ones((10, 3), "float32"), batch_size=4)
        print(outputs.shape)   # (10, 2)
        ```
    """
    import numpy as np
    import tensorflow as tf

    if isinstance(x, (np.ndarray, dict, list, tuple)):  # the inputs, as Keras' predict(x) reads them
        x = data_mod.unlabelled(x)
    elif isinstance(x, str):  # no labels needed: e.g. a folder of images without class subfolders
        x = data_mod.load_to_predict(x, model_image_size=image_size_of(model))
    run = _Inference.of(model, x, use="predict", batch_size=batch_size,
                        per_replica_batch_size=per_replica_batch_size, verbose=verbose, cluster=cluster)
    source = run.source
    with run.own_errors():
        dataset, steps = run.input()
        if run.on_chief:
            batches = _predict_on_chief(model, dataset, steps, run.verbose)
        else:
            batches = _predict_replicas(model, run.strategy, dataset, steps, run.verbose)
    outputs = tf.nest.map_structure(lambda *parts: np.concatenate(parts, axis=0), *batches)
    count = len(tf.nest.flatten(outputs)[0])
    if count != source.num_examples:  # a defect of tfdist's, not of the user's data
        raise RuntimeError(f"tfdist.predict gathered {count} outputs for {source.num_examples} examples")
    return outputs


def _progress(model, steps: int | None, verbose: int):
    keras = keras_of(model)
    return keras.utils.Progbar(steps, verbose=verbose) if verbose else None


def _predict_replicas(model, strategy, dataset, steps: int, verbose: int) -> list:
    """Each step's outputs, gathered from every replica in replica order; returned as the
    replicas' contiguous parts one after another (replica r holds the r-th part of the examples)."""
    import numpy as np
    import tensorflow as tf

    def make():
        def replica(data):
            outputs = model.predict_step(data)
            return outputs, tf.shape(tf.nest.flatten(outputs)[0])[:1]

        def run(batch):
            outputs, counts = strategy.run(replica, args=(batch,))
            gather = lambda value: strategy.gather(value, axis=0)  # noqa: E731
            return tf.nest.map_structure(gather, outputs), gather(counts)

        return tf.function(run, reduce_retracing=True, autograph=False)

    run = _PREDICT.get(model, make)
    replicas = strategy.num_replicas_in_sync
    parts: list[list] = [[] for _ in range(replicas)]
    bar = _progress(model, steps, verbose)
    for i, batch in enumerate(dataset):
        if i >= steps:
            break
        outputs, counts = run(batch)
        outputs, bounds = tf.nest.map_structure(np.asarray, outputs), np.cumsum([0, *np.asarray(counts)])
        for r in range(replicas):
            parts[r].append(tf.nest.map_structure(lambda value: value[bounds[r]:bounds[r + 1]], outputs))
        if bar is not None:
            bar.update(i + 1)
    return [part for replica_parts in parts for part in replica_parts]


def _predict_on_chief(model, dataset, steps: int | None, verbose: int) -> list:
    """Parameter servers: the model's ``predict_step`` over ``dataset`` in this process."""
    import numpy as np
    import tensorflow as tf

    run = _PREDICT.get(model, lambda: tf.function(model.predict_step, reduce_retracing=True, autograph=False))
    bar = _progress(model, steps, verbose)
    batches = []
    for i, batch in enumerate(dataset):
        batches.append(tf.nest.map_structure(np.asarray, run(batch)))
        if bar is not None:
            bar.update(i + 1)
    return batches
