"""A user's own tf.data pipeline: ``tfdist.fit`` against Keras' ``fit``, resume latency by position, state bytes.

The pipeline is the one TensorFlow's tutorials write: TFRecord files (8 files of 64-float
examples and a label), ``map(parse)``, ``shuffle(1000)``, ``batch(64)``, ``prefetch(AUTOTUNE)``.
Keras 3, one device (the CPU), a two-layer MLP. Three parts, in one run:

(a) **Throughput**: examples/s of plain ``model.fit(ds)`` (model built in
``OneDeviceStrategy("/cpu:0")``'s scope) and of ``tfdist.fit(build, ds, strategy="one_device")``
(no checkpoint directory), each in a fresh process, alternated A B B A ... A Keras callback
records the end of every batch; an epoch's time is from its first batch end to its last
(``steps - 1`` steps), the median over epochs 2..E (epoch 1 traces). Target: tfdist >= 0.98x.

(b) **Resume latency by position**: what a resume at step S costs the pipeline. A worker's
pipeline (``WorkerPipeline``) is read to step S (not timed), its position saved
(``WorkerInput.save``); a fresh process then times ``WorkerInput(start_step=S)`` -- the
iterator restored from that file -- and the first batch after it. S = 10 and S = 100,000 (the
pipeline repeated: 195 passes). Beside it, the replay a position-less resume would do
(``skip(S)`` then the first batch), at S = 10 and 10,000 only. Target: 100,000 / 10 <= 1.5x.
The model's own checkpoint does not depend on the position, and is not timed here.

(c) **Checkpoint bytes the pipeline state adds**: the size of the saved position (its files)
with shuffle buffers of 100, 1,000 and 10,000 examples; the model checkpoint's size beside it.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

FILES, PER_FILE, FEATURES, BATCH = 8, 4096, 64, 64


def _write_records(directory: str, per_file: int) -> list[str]:
    import numpy as np
    import tensorflow as tf

    rng = np.random.RandomState(0)
    paths = []
    for f in range(FILES):
        paths.append(os.path.join(directory, f"part-{f}.tfrecord"))
        with tf.io.TFRecordWriter(paths[-1]) as writer:
            for x in rng.rand(per_file, FEATURES).astype(np.float32):
                features = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                            "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x.sum() > FEATURES / 2)]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    return paths


def pipeline(paths, *, buffer: int = 1000):
    """The user's pipeline, as the tutorials write it."""
    import tensorflow as tf

    def parse(record):
        example = tf.io.parse_single_example(record, {"x": tf.io.FixedLenFeature([FEATURES], tf.float32),
                                                      "y": tf.io.FixedLenFeature([], tf.int64)})
        return example["x"], example["y"]

    tf.random.set_seed(7)
    return (tf.data.TFRecordDataset(paths).map(parse, num_parallel_calls=tf.data.AUTOTUNE).shuffle(buffer, seed=1)
            .batch(BATCH).prefetch(tf.data.AUTOTUNE))


def build():
    import keras

    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.jit_compile = False
    return model


# --- children ------------------------------------------------------------------------------------
def _throughput(spec) -> dict:
    import keras
    import tensorflow as tf

    import tfdist

    ends: list[list[float]] = []

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            ends.append([])

        def on_train_batch_end(self, batch, logs=None):
            ends[-1].append(time.perf_counter())

    data = pipeline(spec["paths"])
    if spec["variant"] == "keras fit":
        keras.utils.set_random_seed(1)
        with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
            model = build()
        model.fit(data, epochs=spec["epochs"], verbose=0, callbacks=[Timer()])
    else:
        tfdist.fit(build, data, epochs=spec["epochs"], seed=1, verbose=0, strategy="one_device", callbacks=[Timer()])
    seconds = sorted((e[-1] - e[0]) / (len(e) - 1) for e in ends[1:])
    return {"examples_per_s": BATCH / seconds[len(seconds) // 2], "steps_per_epoch": len(ends[0])}


def _position(spec) -> dict:
    """Saves a worker's position after ``step`` steps (reading there is not timed)."""
    import tensorflow as tf

    from tfdist.data import UserPipeline, WorkerInput

    source = UserPipeline(pipeline(spec["paths"], buffer=spec["buffer"]))
    worker = source.bind(tf.distribute.OneDeviceStrategy("/cpu:0"))
    data = WorkerInput(worker, worker.strategy, directory=spec["directory"], start_step=0)
    skip = data.iterator  # read on to the step
    for _ in range(spec["step"]):
        next(skip)
    data.save(spec["step"])
    return {"state_bytes": data.state_bytes(spec["step"])}


def _resume(spec) -> dict:
    """Times a resume of the pipeline at ``step``: restored from its position, or replayed (skip)."""
    import tensorflow as tf

    from tfdist.data import UserPipeline, WorkerInput

    source = UserPipeline(pipeline(spec["paths"], buffer=spec["buffer"]))
    worker = source.bind(tf.distribute.OneDeviceStrategy("/cpu:0"))
    start = time.perf_counter()
    if spec["how"] == "restore":
        data = WorkerInput(worker, worker.strategy, directory=spec["directory"], start_step=spec["step"])
        assert data.restored_from is not None
        next(data.iterator)
    else:
        next(iter(worker.dataset.skip(spec["step"])))
    return {"seconds": time.perf_counter() - start}


def _model_bytes(spec) -> dict:
    import tensorflow as tf

    model = build()
    model.optimizer.build(model.trainable_variables)
    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(os.path.join(spec["directory"], "m"))
    return {"bytes": sum(os.path.getsize(os.path.join(spec["directory"], f)) for f in os.listdir(spec["directory"])
                         if f.startswith(os.path.basename(path)))}


CHILDREN = {"throughput": _throughput, "position": _position, "resume": _resume, "model_bytes": _model_bytes}


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0])
    _common.add_reps_option(p, default=4)
    p.add_argument("--epochs", type=int, default=4, help="epochs of each throughput run (default 4)")
    args = p.parse_args()
    if args.child:
        import json

        _common.quiet_tensorflow()
        spec = json.loads(args.child)
        _common.emit(CHILDREN[spec["part"]](spec))
        return
    reps = args.reps or (1 if args.quick else 4)
    per_file = 512 if args.quick else PER_FILE
    epochs = 2 if args.quick else args.epochs
    far = 1000 if args.quick else 100_000
    script = os.path.abspath(__file__)
    work = tempfile.mkdtemp(prefix="tfdist-user-pipeline-")
    info = _common.machine(paths=[work])
    import tensorflow as tf  # noqa: F401 -- the records are written here

    paths = _write_records(work, per_file)
    results: dict = {"throughput": {}, "resume": {}, "bytes": {}}

    # (a) throughput, alternated.
    for rep, variant in _common.alternate(["keras fit", "tfdist.fit"], reps):
        run = _common.run_child(script, {"part": "throughput", "variant": variant, "paths": paths, "epochs": epochs},
                                timeout=1200)
        results["throughput"].setdefault(variant, []).append(run)
        print(f"(a) rep {rep} {variant}: {run['examples_per_s']:.0f} examples/s", flush=True)
    ratio = _common.paired(results["throughput"]["keras fit"], results["throughput"]["tfdist.fit"], "examples_per_s")

    # (b) resume latency by position; (c) the state's bytes.
    for step in (10, far):
        directory = os.path.join(work, f"positions-{step}")
        saved = _common.run_child(script, {"part": "position", "paths": paths, "step": step, "buffer": 1000,
                                           "directory": directory}, timeout=3600)
        for rep, how in _common.alternate(["restore", "replay"], reps):
            if how == "replay" and step > 10_000:
                continue
            run = _common.run_child(script, {"part": "resume", "how": how, "paths": paths, "step": step,
                                             "buffer": 1000, "directory": directory})
            results["resume"].setdefault(f"{how} {step}", []).append(run)
        print(f"(b) step {step}: restore {_common.fmt(_common.summary_of(results['resume'][f'restore {step}'], 'seconds'))} s",
              flush=True)
        results["bytes"][f"buffer 1000 at step {step}"] = saved["state_bytes"]
    replay_far = 10_000 if not args.quick else far
    directory = os.path.join(work, "replay")
    for rep in range(reps):
        results["resume"].setdefault(f"replay {replay_far}", []).append(_common.run_child(
            script, {"part": "resume", "how": "replay", "paths": paths, "step": replay_far, "buffer": 1000,
                     "directory": directory}))
    for buffer in (100, 10_000):
        saved = _common.run_child(script, {"part": "position", "paths": paths, "step": 10, "buffer": buffer,
                                           "directory": os.path.join(work, f"buffer-{buffer}")})
        results["bytes"][f"buffer {buffer} at step 10"] = saved["state_bytes"]
    model = _common.run_child(script, {"part": "model_bytes", "directory": os.path.join(work, "model")})["bytes"]

    near, far_s = (_common.summary_of(results["resume"][f"restore {s}"], "seconds") for s in (10, far))
    latency = far_s["median"] / near["median"]
    example = FEATURES * 4 + 8
    rows = [
        ["(a) examples/s, Keras fit", _common.fmt(_common.summary_of(results["throughput"]["keras fit"], "examples_per_s"), digits=4), "", ""],
        ["(a) examples/s, tfdist.fit", _common.fmt(_common.summary_of(results["throughput"]["tfdist.fit"], "examples_per_s"), digits=4), "", ""],
        ["(a) tfdist / Keras (paired)", _common.fmt_ratio(ratio), ">= 0.98", _common.verdict(ratio["median"], 0.98, below=False)],
        ["(b) resume at step 10: restore + first batch", _common.fmt(near, unit=" s"), "", ""],
        [f"(b) resume at step {far:,}: restore + first batch", _common.fmt(far_s, unit=" s"), "", ""],
        [f"(b) step {far:,} / step 10", f"{latency:.2f}", "<= 1.5", _common.verdict(latency, 1.5)],
        ["(b) replay instead (skip): step 10", _common.fmt(_common.summary_of(results["resume"]["replay 10"], "seconds"), unit=" s"), "", ""],
        [f"(b) replay instead (skip): step {replay_far:,}",
         _common.fmt(_common.summary_of(results["resume"][f"replay {replay_far}"], "seconds"), unit=" s"), "", ""],
    ] + [[f"(c) pipeline state, shuffle {key}", f"{value / 1024:.1f} KiB", f"~ buffer x {example} B", ""]
         for key, value in results["bytes"].items()] + [["(c) the model's checkpoint, for scale", f"{model / 1024:.1f} KiB", "", ""]]
    _common.finish(
        title="A user's own tf.data pipeline (benchmarks/user_pipeline.py)", info=info,
        command="python benchmarks/user_pipeline.py" + (" --quick" if args.quick else ""), results=results, rows=rows,
        notes=[f"{FILES} TFRecord files x {per_file} examples of {FEATURES} floats; batch {BATCH}; Keras 3, one CPU "
               f"device; {epochs} epochs a throughput run, epoch 1 left out."], args=args)


if __name__ == "__main__":
    main()
