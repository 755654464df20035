"""Step-time overhead of ``tfdist.fit`` under multi_worker_mirrored, tf_keras and Keras 3.

Every variant is a real cluster of 2 local worker processes (TF_CONFIG on free 127.0.0.1
ports) training the same built-in model (``tfdist.models.builder(name, keras=...)``) on the
digits training split, with the same global batch, epochs and seed.

tf_keras (``--keras 2``), against plain tf_keras ``fit`` (target: ratio <= 1.02):

* plain:  ``tf.distribute.MultiWorkerMirroredStrategy()``, the model built in its scope,
  ``Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed).batch(B, drop_remainder=True)``
  (auto-sharded by data), ``model.fit(ds, epochs=E)``;
* tfdist: ``tfdist.fit(builder, source, batch_size=B, strategy="multi_worker_mirrored")``
  without a checkpoint directory;
* tfdist, agreement every step: the same with ``tfdist.training.preemption.AGREE_PERIOD_SECONDS = 0``,
  i.e. the workers all-reduce their preemption flags after every step (what tfdist did
  before the agreement cadence): shows what that cadence saves.

Keras 3 (``--keras 3``). Plain Keras 3 ``fit`` does not run under MultiWorkerMirroredStrategy
(Keras 3.15: it fails in ``_maybe_symbolic_build``, then in ``reduce_per_replica``;
tensorflow/tensorflow#72388), so there is no plain ``fit`` to compare with. The script tries
it once per run (the same code as tf_keras' plain variant, with a Keras 3 model) and prints
what happened as that row's result -- the error, or, should a later Keras run it, its step
time. The baseline of the target's ratio is instead the loop a user has to write without
tfdist, doing per step what ``fit`` does:

* loop: the model built in the strategy's scope, its optimizer built there
  (``optimizer.build(model.trainable_variables)``) and its metric variables created by one
  eager ``strategy.run(model.test_step, ...)`` (created inside the ``tf.function`` they would
  fail under mirrored strategies); the same dataset, repeated, through
  ``strategy.experimental_distribute_dataset`` (one iterator for all epochs); per step, a
  ``tf.function`` (no autograph, no XLA, as ``fit``'s) running
  ``strategy.run(model.train_step, args=(next(iterator),))`` and returning
  ``model.get_metrics_result()`` (the whole global batch's metrics, an all-reduce), read into
  Python floats -- which Keras 3's ``CallbackList`` does after every batch with the
  TensorFlow backend; ``model.reset_metrics()`` before each epoch;
* tfdist: ``tfdist.fit`` as for tf_keras, i.e. tfdist's own loop (``tfdist.training.loop``).

The loop is the same computation per step as tfdist's loop (one step per ``tf.function``
call, metrics read every step), so the ratio is what tfdist's own work costs: its
controller, the preemption agreement, the callbacks, its input pipeline (each worker
reads its own stream, where the loop's dataset is auto-sharded by data, as plain ``fit``'s
is). tfdist's one-worker run is no baseline: one replica, no collectives. Keras 3 against tf_keras (tfdist / plain tf_keras
``fit``) is printed for information when both run.

The clusters run one after another (each uses both cores), alternated A B C, C B A, ...
Step time = median duration of epochs 2..E on worker 0 / steps per epoch (an epoch-level
callback of the model's Keras, or the loop's own clock around the same span; the first
epoch, with tracing and the cluster's start, is excluded); ratios are paired within a
repetition.

    python benchmarks/multi_worker_overhead.py [--keras {2,3,both}] [--reps N] [--quick] [--json PATH] [--markdown PATH]
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

TARGET = 1.02
VARIANTS = {"2": ("plain", "tfdist", "tfdist-agree-every-step"), "3": ("loop", "tfdist")}
KERAS_LABELS, KERAS_CHOICES = _common.KERAS_LABELS, _common.KERAS_CHOICES


def _hand_written_loop(builder, ds, *, strategy, steps: int, epochs: int, begin: list, end: list) -> float:
    """Keras 3 under multi_worker_mirrored without tfdist (see the docstring); times each epoch,
    returns the last epoch's loss."""
    import tensorflow as tf

    with strategy.scope():
        model = builder()
        model.optimizer.build(model.trainable_variables)
    iterator = iter(strategy.experimental_distribute_dataset(ds.repeat()))
    x, y = next(iter(ds))
    sample = strategy.experimental_distribute_values_from_function(
        lambda ctx: (x[: len(x) // ctx.num_replicas_in_sync], y[: len(y) // ctx.num_replicas_in_sync]))
    with strategy.scope():
        strategy.run(model.test_step, args=(sample,))  # creates the metric variables, eagerly
    model.reset_metrics()

    @tf.function(autograph=False)
    def train(iterator):
        strategy.run(model.train_step, args=(next(iterator),))
        return model.get_metrics_result()

    for _ in range(epochs):
        model.reset_metrics()
        begin.append(time.perf_counter())
        for _ in range(steps):
            logs = {key: float(value) for key, value in train(iterator).items()}
        end.append(time.perf_counter())
    return logs["loss"]


def _describe(error: BaseException) -> str:
    """One line: the error, where in Keras it was raised, its message without the tensors it prints."""
    import re
    import traceback

    frames = [f.name for f in traceback.extract_tb(error.__traceback__)
              if f"{os.sep}keras{os.sep}" in f.filename and not f.filename.endswith("traceback_utils.py")]
    message = re.sub(r"\(PerReplica:\{.*\}\)", "(PerReplica:{...})", str(error), flags=re.S)
    message = " ".join(message.split())
    return f"{type(error).__name__} in {' > '.join(frames[:3]) or '?'}: {message[:240]}"


def child(spec: dict) -> None:
    """One worker of one variant's cluster (TF_CONFIG is in the environment)."""
    _common.quiet_tensorflow()
    import tensorflow as tf

    import tfdist
    from tfdist import data as data_mod
    from tfdist import models
    from tfdist.training import preemption

    keras_version = spec["keras"]
    keras_module = models.keras_module(keras_version)
    train, _ = data_mod.load_digits()
    x, y = train.x, train.y
    builder = models.builder(spec["model"], input_shape=x.shape[1:], num_classes=10, keras=keras_version)
    batch, epochs, seed = spec["batch"], spec["epochs"], spec["seed"]
    steps = len(x) // batch
    begin, end = [], []

    class Timer(keras_module.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            begin.append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            end.append(time.perf_counter())

    if spec["variant"] in ("plain", "loop"):
        keras_module.utils.set_random_seed(seed)
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed).batch(batch, drop_remainder=True)
        if spec["variant"] == "loop":
            loss = _hand_written_loop(builder, ds, strategy=strategy, steps=steps, epochs=epochs, begin=begin, end=end)
        else:
            with strategy.scope():
                model = builder()
            if keras_version == "3":
                keras_module.config.disable_traceback_filtering()  # name Keras' own frames in the error
            try:
                loss = model.fit(ds, epochs=epochs, verbose=0, callbacks=[Timer()]).history["loss"][-1]
            except Exception as e:  # plain Keras 3 fit: the failure is the result (see the docstring)
                if keras_version == "2":
                    raise
                _common.emit({"keras": keras_version, "variant": spec["variant"], "error": _describe(e)})
                return
        replicas = strategy.num_replicas_in_sync
    else:
        if spec["variant"] == "tfdist-agree-every-step":
            preemption.AGREE_PERIOD_SECONDS = 0.0
        history = tfdist.fit(builder, train, epochs=epochs, batch_size=batch, strategy="multi_worker_mirrored",
                             seed=seed, verbose=0, callbacks=[Timer()])
        replicas, loss = history.tfdist.num_replicas, history.history["loss"][-1]
    durations = [e - b for b, e in zip(begin, end)]
    _common.emit({"keras": keras_version, "variant": spec["variant"], "replicas": replicas, "steps_per_epoch": steps,
                  "last_epoch_loss": loss, "epoch_seconds": durations, "step_seconds": _common.summary(durations[1:])["median"] / steps})


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def run_cluster(spec: dict, *, workers: int = 2, timeout: float = 600) -> dict:
    """Runs one variant as a local cluster; returns worker 0's result."""
    ports = _free_ports(workers)
    procs = []
    for index in range(workers):
        environ = _common.child_env()
        environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                                           "task": {"type": "worker", "index": index}})
        procs.append(subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)], env=environ,
                                      cwd=_common.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for line in outputs[0].splitlines():
        if line.startswith(_common.RESULT_PREFIX):
            return json.loads(line[len(_common.RESULT_PREFIX):])
    sys.stderr.write("\n".join(out[-4000:] for out in outputs))
    raise RuntimeError(f"cluster {spec} failed: exit codes {[p.returncode for p in procs]}")


def _rows_tf_keras(step: dict, ratio: dict, what: str) -> list:
    return [
        ("tf_keras", f"{what}: step time tfdist / plain `model.fit`", f"**{_common.fmt_ratio(ratio['tfdist'])}**; "
         f"plain {_common.fmt(step['plain'], 1e3, ' ms')}, tfdist {_common.fmt(step['tfdist'], 1e3, ' ms')}",
         f"≤ {TARGET}", _common.verdict(ratio["tfdist"]["median"], TARGET)),
        ("tf_keras", f"{what}: step time tfdist with an all-reduce of its flags after every step / plain",
         f"{_common.fmt_ratio(ratio['tfdist-agree-every-step'])}; "
         f"{_common.fmt(step['tfdist-agree-every-step'], 1e3, ' ms')}", "(information)", "–"),
    ]


def _rows_keras3(plain_fit: dict, step: dict, ratio: dict, what: str) -> list:
    if "error" in plain_fit:
        plain = f"**fails**: `{plain_fit['error']}`"
    else:
        plain = (f"runs (a Keras newer than 3.15?): step {plain_fit['step_seconds'] * 1e3:.3g} ms (n=1); tfdist / plain "
                 f"fit {step['tfdist']['median'] / plain_fit['step_seconds']:.3f}")
    return [
        ("Keras 3", f"{what}: plain `model.fit` under multi_worker_mirrored", plain, "–", "–"),
        ("Keras 3", f"{what}: step time tfdist / hand-written loop (`strategy.run(model.train_step)`, metrics read "
         "every step)", f"**{_common.fmt_ratio(ratio['tfdist'])}**; loop {_common.fmt(step['loop'], 1e3, ' ms')}, "
         f"tfdist {_common.fmt(step['tfdist'], 1e3, ' ms')}", f"≤ {TARGET}",
         _common.verdict(ratio["tfdist"]["median"], TARGET)),
    ]


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0])
    _common.add_keras_option(p)
    _common.add_reps_option(p, default=4)
    args = p.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    quick = args.quick
    kerases = KERAS_CHOICES[args.keras]
    info = _common.machine()
    model, batch, epochs, reps = ("mlp", 64, 3, 1) if quick else ("cnn", 64, 12, 4)
    reps = args.reps or reps
    base = {"model": model, "batch": batch, "epochs": epochs}
    plain_fit = None
    if "3" in kerases:
        plain_fit = run_cluster({**base, "keras": "3", "variant": "plain", "seed": 0}, timeout=300)
        print(f"  Keras 3 plain model.fit: {plain_fit.get('error') or 'ran'}", flush=True)
    specs = {_common.keras_variant(k, v): {"keras": k, "variant": v} for k in kerases for v in VARIANTS[k]}
    names = list(specs)
    runs: dict[str, dict[str, list[dict]]] = {k: {v: [] for v in VARIANTS[k]} for k in kerases}
    for rep, name in _common.alternate(names, reps):
        result = run_cluster({**base, **specs[name], "seed": rep})
        assert result["replicas"] == 2, result
        runs[result["keras"]][result["variant"]].append(result)
        print(f"  rep {rep} {name:32s}: step {result['step_seconds'] * 1e3:.2f} ms, last epoch's loss "
              f"{result['last_epoch_loss']:.3f}", flush=True)
    steps = next(r for k in kerases for v in VARIANTS[k] for r in runs[k][v])["steps_per_epoch"]
    what = f"{model}, global batch {batch} on 2 workers ({steps} steps/epoch, epochs 2–{epochs} timed)"
    results: dict = {"plain_keras3_fit": plain_fit}
    rows = []
    for keras in kerases:
        baseline = "plain" if keras == "2" else "loop"
        r = runs[keras]
        step = {v: _common.summary_of(r[v], "step_seconds") for v in r}
        ratio = {v: _common.paired(r[baseline], r[v], "step_seconds") for v in r if v != baseline}
        results[KERAS_LABELS[keras]] = {"runs": r, "step_seconds": step, "ratio": ratio, "baseline": baseline}
        rows += _rows_tf_keras(step, ratio, what) if keras == "2" else _rows_keras3(plain_fit, step, ratio, what)
    if len(kerases) == 2:
        cross = _common.paired(runs["2"]["plain"], runs["3"]["tfdist"], "step_seconds")
        results["keras3_tfdist_over_tf_keras_plain"] = cross
        rows.append(("Keras 3 / tf_keras", f"{what}: step time tfdist with a Keras 3 model / plain tf_keras `model.fit`",
                     _common.fmt_ratio(cross), "(information)", "–"))
    notes = [f"{reps} repetitions; in each, the {len(names)} variants ({', '.join(names)}) run as 2-process clusters "
             "one after another (alternated); ratios are paired; epoch-level timer on worker 0; first epoch excluded."]
    if plain_fit is not None:
        notes.append("Plain Keras 3 `model.fit` was tried once, with the tf_keras plain variant's code; Keras 3's "
                     "baseline is the hand-written loop of the script's docstring.")
    command = " ".join(["python benchmarks/multi_worker_overhead.py", *(["--quick"] if quick else []),
                        *([f"--keras {args.keras}"] if args.keras != "both" else []),
                        *([f"--reps {args.reps}"] if args.reps is not None else [])])
    _common.finish(title="multi-worker fit overhead: tfdist.fit vs plain, "
                   f"{' and '.join(KERAS_LABELS[k] for k in kerases)} (multi_worker_mirrored, 2 local workers, CPU, "
                   "digits)", info=info, command=command, results=results, rows=rows,
                   header=("Keras", "Figure", "Measured: median (min–max, n)", "Target", "Met?"), notes=notes,
                   args=args)


if __name__ == "__main__":
    main()
