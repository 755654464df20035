"""Step-time overhead of ``tfdist.fit`` under multi_worker_mirrored, over plain tf_keras.

Every variant is a real cluster of 2 local worker processes (TF_CONFIG on free 127.0.0.1
ports) training the same built-in model on the digits training split, with the same global
batch, epochs and seed:

* plain:  ``tf.distribute.MultiWorkerMirroredStrategy()``, the model built in its scope,
  ``Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed).batch(B, drop_remainder=True)``
  (auto-sharded by data), ``model.fit(ds, epochs=E)``;
* tfdist: ``tfdist.fit(builder, source, batch_size=B, strategy="multi_worker_mirrored")``
  without a checkpoint directory;
* tfdist, agreement every step: the same with ``tfdist.training.preemption.AGREE_PERIOD_SECONDS = 0``,
  i.e. the workers all-reduce their preemption flags after every step (what tfdist did
  before the agreement cadence): shows what that cadence saves.

The clusters run one after another (each uses both cores), alternated A B C, C B A, ...
Step time = median duration of epochs 2..E on worker 0 / steps per epoch (an epoch-level
callback; the first epoch, with tracing and the cluster's start, is excluded); ratios are
paired within a repetition.

    python benchmarks/multi_worker_overhead.py [--quick] [--json PATH] [--markdown PATH]
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
VARIANTS = ("plain", "tfdist", "tfdist-agree-every-step")


def child(spec: dict) -> None:
    """One worker of one variant's cluster (TF_CONFIG is in the environment)."""
    _common.quiet_tensorflow()
    import tensorflow as tf
    import tf_keras

    import tfdist
    from tfdist import data as data_mod
    from tfdist import models
    from tfdist.training import preemption

    train, _ = data_mod.load_digits()
    x, y = train.x, train.y
    builder = models.builder(spec["model"], input_shape=x.shape[1:], num_classes=10, keras=spec.get("keras", "2"))
    batch, epochs, seed = spec["batch"], spec["epochs"], spec["seed"]
    begin, end = [], []

    class Timer(tf_keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            begin.append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            end.append(time.perf_counter())

    if spec["variant"] == "plain":
        tf_keras.utils.set_random_seed(seed)
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            model = builder()
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed).batch(batch, drop_remainder=True)
        model.fit(ds, epochs=epochs, verbose=0, callbacks=[Timer()])
        replicas = strategy.num_replicas_in_sync
    else:
        if spec["variant"] == "tfdist-agree-every-step":
            preemption.AGREE_PERIOD_SECONDS = 0.0
        history = tfdist.fit(builder, train, epochs=epochs, batch_size=batch, strategy="multi_worker_mirrored",
                             seed=seed, verbose=0, callbacks=[Timer()])
        replicas = history.tfdist.num_replicas
    steps = len(x) // batch
    durations = [e - b for b, e in zip(begin, end)]
    _common.emit({"variant": spec["variant"], "replicas": replicas, "steps_per_epoch": steps,
                  "epoch_seconds": durations, "step_seconds": _common.summary(durations[1:])["median"] / steps})


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


def main() -> None:
    args = _common.parser(__doc__.splitlines()[0]).parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    quick = args.quick
    info = _common.machine()
    model, batch, epochs, reps = ("mlp", 64, 3, 1) if quick else ("cnn", 64, 12, 4)
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for rep, variant in _common.alternate(VARIANTS, reps):
        result = run_cluster({"variant": variant, "model": model, "batch": batch, "epochs": epochs, "seed": rep})
        assert result["replicas"] == 2, result
        runs[variant].append(result)
        print(f"  rep {rep} {variant:24s}: step {result['step_seconds'] * 1e3:.2f} ms", flush=True)
    step = {v: _common.summary([r["step_seconds"] for r in runs[v]]) for v in VARIANTS}
    ratio = {v: _common.summary([r["step_seconds"] / p["step_seconds"] for r, p in zip(runs[v], runs["plain"])])
             for v in VARIANTS[1:]}
    steps = runs["plain"][0]["steps_per_epoch"]
    what = f"{model}, global batch {batch} on 2 workers ({steps} steps/epoch, epochs 2–{epochs} timed)"
    rows = [
        (f"{what}: step time tfdist / plain", f"**{_common.fmt_ratio(ratio['tfdist'])}**; plain "
         f"{_common.fmt(step['plain'], 1e3, ' ms')}, tfdist {_common.fmt(step['tfdist'], 1e3, ' ms')}",
         f"≤ {TARGET}", _common.verdict(ratio["tfdist"]["median"], TARGET)),
        (f"{what}: step time tfdist with an all-reduce of its flags after every step / plain",
         f"{_common.fmt_ratio(ratio['tfdist-agree-every-step'])}; "
         f"{_common.fmt(step['tfdist-agree-every-step'], 1e3, ' ms')}", "(information)", "–"),
    ]
    notes = [f"{reps} repetitions; in each, the {len(VARIANTS)} variants run as 2-process clusters one after "
             "another (alternated); ratios are paired; epoch-level timer on worker 0; first epoch excluded."]
    _common.finish(title="multi-worker fit overhead: tfdist.fit vs plain tf_keras model.fit "
                   "(multi_worker_mirrored, 2 local workers, CPU, digits)",
                   info=info, command="python benchmarks/multi_worker_overhead.py" + (" --quick" if quick else ""),
                   results={"runs": runs, "step_seconds": step, "ratio": ratio}, rows=rows, notes=notes, args=args)


if __name__ == "__main__":
    main()
