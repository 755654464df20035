"""The GPU paths, measured on a GPU: fit overhead, mixed precision, NCCL, async saves, input stalls, plan.

Without a GPU this script says so and exits 0 (it is not part of CI); ``--allow-cpu`` runs
every part on the CPU with tiny sizes instead, so that the script itself can be tested on a
machine without a GPU -- its numbers then mean nothing, and its output says so.

Every figure compares variants measured side by side in this one run (see "How the
measurements are made" in benchmarks/RESULTS.md): training variants run in fresh processes
in lockstep (``_common.lockstep``: one trains an epoch while the others wait, in a rotating
order; waiting is never timed) and ratios are paired by repetition. The processes share the
GPU: ``TF_FORCE_GPU_ALLOW_GROWTH=true`` makes each take only the memory it uses.

The workload of (a), (b) and (d) keeps a GPU busy: a ResNet-style CNN (3 stages of 2 residual
blocks, 64/128/256 channels, batch normalization; ~2.8 M parameters) on CIFAR-sized
generated images (32x32x3, 10 classes), batch 256 per replica. Step time = median epoch
duration over epochs 2..E / steps per epoch (the first epoch traces the step; it is left out).

(a) ``tfdist.fit`` vs plain tf_keras ``model.fit`` on the same strategy (one_device, GPU:0),
    in float32, mixed_float16 and mixed_bfloat16: six processes in lockstep. Plain: the
    policy set before the model is built in the strategy's scope, data
    ``from_tensor_slices.shuffle(N).batch(B, drop_remainder=True).prefetch(AUTOTUNE)`` (the
    tf.data guide's GPU pipeline). Target: tfdist / plain step time <= 1.02 in each precision.
    Reported: each mixed policy's speed-up over float32 (tfdist), and mixed_float16's
    dynamic loss scale at the end of the run (finite and > 1: loss scaling works).
(b) Several GPUs, per-replica batch held at 256 (weak scaling): ``tfdist.fit`` under
    ``mirrored`` with NCCL, with hierarchical copy, with ``auto``, and plain ``model.fit`` with NCCL,
    against one_device on one GPU. Scaling efficiency = examples/s with N GPUs / (N x
    examples/s with one). With a single physical GPU, ``--logical-gpus N`` carves N logical
    GPUs out of it (``tf.config.set_logical_device_configuration``, each with
    ``--logical-gpu-memory`` MB), and the table says so: they share one GPU's compute, so the
    efficiency shows the cost of replication and all-reduce, not scaling; NCCL cannot run on
    them (tfdist refuses it with one line -- the row shows the message -- and ``auto``
    reduces to one device, as TensorFlow itself falls back).
(c) Asynchronous saves of state in GPU memory, reusing benchmarks/checkpoint.py: its (a) with
    the "wide" model + Adam (~594 MB) built on GPU:0: blocked time of an async save / time of a
    sync save (target <= 0.05; an async save blocks while the state is copied to host memory);
    and its (b): training throughput of ``tfdist.fit`` with a save every N steps vs none, in
    lockstep, with an MLP of ~590 MB of state on the GPU (the seconds between saves are
    reported; target <= 3.5 % loss).
(d) Input stalls: the ResNet trained by ``tfdist.fit`` from in-memory arrays vs plain
    ``model.fit`` on one generated batch repeated (``from_tensors(batch).repeat().prefetch()``:
    no input work at all). Stall = 1 - synthetic step time / tfdist step time: the fraction of a step
    the GPU waits for tfdist's input pipeline. nvidia-smi's ``utilization.gpu`` (coarse: the
    share of time a kernel ran) during the timed epochs is shown when nvidia-smi exists. The
    same from a TFRecord file through ``tfdist.TFRecordSource`` runs only when this tfdist has
    it (``hasattr(tfdist, "TFRecordSource")``: it is being built on another branch).
(e) ``tfdist plan --measure`` of the built-in Keras 3 cnn on 32x32x3 inputs (run as a user runs
    it, with ``benchmarks/plan_accuracy.py``'s ``run_plan``): predicted vs measured steady-state
    epoch time of ``tfdist.fit`` on the GPU, with and without gradient accumulation
    (target +-15 %).

(f) A user's own tf.data pipeline (TFRecord files, ``map(parse)``, ``shuffle``, ``batch(drop_remainder=True)``,
    ``prefetch``), with the ResNet in Keras 3: its input stall under ``tfdist.fit`` and under Keras 3's own
    ``model.fit``, against ``model.fit`` on one batch repeated; and tfdist / ``model.fit`` step time.

    python benchmarks/gpu.py [--quick] [--allow-cpu] [--parts abcdef] [--json PATH] [--markdown PATH]
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

TARGET_OVERHEAD = 1.02
TARGET_ASYNC_BLOCK = 0.05
TARGET_THROUGHPUT_LOSS = 0.035
TARGET_PLAN = 0.15
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
CPU_NOTE = "CPU STAND-IN (--allow-cpu): tiny sizes on the CPU; these numbers mean nothing about a GPU"


@dataclasses.dataclass(frozen=True)
class Workload:
    """The ResNet workload of (a), (b), (d) and its data."""

    image: int = 32
    width: int = 64
    blocks: int = 2
    batch: int = 256  # per replica
    steps: int = 50  # per epoch
    epochs: int = 6
    classes: int = 10


def workloads(*, gpu: bool, quick: bool) -> Workload:
    if not gpu:  # --allow-cpu: only checks that every code path runs
        return Workload(image=8, width=4, blocks=1, batch=16, steps=4, epochs=3)
    return Workload(steps=10, epochs=3) if quick else Workload()


# --- the child processes -------------------------------------------------------------------------
def resnet_builder(w: dict, keras_name: str = "tf_keras"):
    """A function that builds and compiles the ResNet-style CNN (called inside a strategy's scope),
    with tf_keras (``keras_name="tf_keras"``, parts a, b, d) or Keras 3 (``"keras"``, part f)."""

    def build():
        import importlib

        from tfdist import models

        tf_keras = importlib.import_module(keras_name)
        layers = tf_keras.layers

        def conv_bn(x, filters, kernel, stride=1):
            x = layers.Conv2D(filters, kernel, strides=stride, padding="same", use_bias=False)(x)
            return layers.BatchNormalization()(x)

        inputs = tf_keras.Input(shape=(w["image"], w["image"], 3))
        x = layers.ReLU()(conv_bn(inputs, w["width"], 3))
        for stage in range(3):
            filters = w["width"] * 2**stage
            for block in range(w["blocks"]):
                stride = 2 if stage and not block else 1
                y = conv_bn(layers.ReLU()(conv_bn(x, filters, 3, stride)), filters, 3)
                shortcut = x if stride == 1 and x.shape[-1] == filters else conv_bn(x, filters, 1, stride)
                x = layers.ReLU()(layers.Add()([shortcut, y]))
        x = layers.GlobalAveragePooling2D()(x)
        outputs = layers.Dense(w["classes"], dtype="float32")(x)  # logits in float32 under mixed precision
        return models.compile_default(tf_keras.Model(inputs, outputs, name="resnet"),
                                      keras="2" if keras_name == "tf_keras" else "3")

    return build


def _images(count: int, image: int, classes: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.random((count, image, image, 3), dtype=np.float32), rng.integers(0, classes, count).astype(np.int32)


def _setup_devices(carve: dict | None) -> None:
    """Logical devices, before TensorFlow's runtime starts: GPUs carved from GPU:0, or CPUs."""
    if not carve:
        return
    import tensorflow as tf

    if carve["type"] == "GPU":
        gpu = tf.config.list_physical_devices("GPU")[0]
        config = tf.config.LogicalDeviceConfiguration(memory_limit=carve["memory_mb"])
        tf.config.set_logical_device_configuration(gpu, [config] * carve["count"])
    else:
        from tfdist import split_cpu

        split_cpu(carve["count"])


class UtilizationSampler:
    """nvidia-smi's utilization.gpu of the first visible GPU, sampled every 100 ms while running."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and shutil.which("nvidia-smi") is not None
        first = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
        self.index = first if first.isdigit() else "0"
        self.proc = None
        self.samples: list[list[int]] = []

    def start(self) -> None:
        if self.enabled:
            self.proc = subprocess.Popen(
                ["nvidia-smi", "-i", self.index, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                 "-lms", "100"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        self.proc = None
        self.samples.append([int(v) for v in out.split() if v.strip().isdigit()])


def _timer(turns, sampler):
    import tf_keras

    class Timer(tf_keras.callbacks.Callback):
        """Epoch timestamps; passes the turn between epochs; samples utilization in epochs 2..E."""

        def __init__(self):
            super().__init__()
            self.begin: list[float] = []
            self.end: list[float] = []
            self.loss: float | None = None
            self.loss_scale: float | None = None

        def on_epoch_begin(self, epoch, logs=None):
            now = time.perf_counter()
            if self.end:
                now = turns.pass_turn()
                sampler.start()
            self.begin.append(now)

        def on_epoch_end(self, epoch, logs=None):
            self.end.append(time.perf_counter())
            sampler.stop()
            self.loss = float((logs or {}).get("loss", float("nan")))

        def on_train_end(self, logs=None):
            optimizer = self.model.optimizer
            if isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer):
                self.loss_scale = float(optimizer.loss_scale)

    return Timer()


def _write_records(x, y, directory: str, *, files: int) -> list[str]:
    """The images as uint8 bytes + label in ``files`` TFRecord files (example i in file i mod ``files``)."""
    import numpy as np
    import tensorflow as tf

    pixels = (x * 255).astype(np.uint8)
    paths = []
    for f in range(files):
        path = os.path.join(directory, f"train-{f:05d}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for image, label in zip(pixels[f::files], y[f::files]):
                feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                           "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        paths.append(path)
    return paths


def user_pipeline(paths: list[str], shape: list[int], batch: int, seed: int):
    """A user's own pipeline, as TensorFlow's tutorials write it: records parsed one by one, shuffled,
    batched to the global batch with ``drop_remainder=True``, prefetched."""
    import tensorflow as tf

    def parse(serialized):
        f = tf.io.parse_single_example(serialized, {"image": tf.io.FixedLenFeature([], tf.string),
                                                    "label": tf.io.FixedLenFeature([], tf.int64)})
        image = tf.reshape(tf.io.decode_raw(f["image"], tf.uint8), shape)
        return tf.cast(image, tf.float32) / 255.0, tf.cast(f["label"], tf.int32)

    dataset = tf.data.TFRecordDataset(paths).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.shuffle(2048, seed=seed).batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _tfrecord_source(x, y, directory: str, *, files: int = 1):
    """The images written to ``files`` TFRecord files (uint8 bytes + label, example i in file i
    mod ``files``), read back by tfdist.TFRecordSource."""
    import tensorflow as tf

    import tfdist

    paths = _write_records(x, y, directory, files=files)
    shape = list(x.shape[1:])

    def parse(serialized):  # one per-replica batch of records
        f = tf.io.parse_example(serialized, {"image": tf.io.FixedLenFeature([], tf.string),
                                             "label": tf.io.FixedLenFeature([], tf.int64)})
        images = tf.reshape(tf.io.decode_raw(f["image"], tf.uint8), [-1, *shape])
        return tf.cast(images, tf.float32) / 255.0, tf.cast(f["label"], tf.int32)

    return tfdist.TFRecordSource(paths, parse)


def _gather_in_graph() -> None:
    """(d)'s "graph gather" variant: tfdist's in-memory source reads its rows with ``tf.gather``
    from CPU tensors (a copy of the arrays) instead of from NumPy through ``tf.numpy_function``,
    which holds the GIL while it copies (``benchmarks/device/gather_gil.py``). The benchmark's
    question: does that reader close the gap between tfdist and plain ``model.fit`` at the
    shortest steps? tfdist itself is unchanged."""
    import tensorflow as tf
    from tfdist.data import arrays

    def gather_fn(self, *, embed: bool = False):
        with tf.init_scope(), tf.device("/cpu:0"):
            leaves = [tf.constant(leaf) for leaf in self._leaves]
        element = self._element
        return lambda idx: tf.nest.pack_sequence_as(element, [tf.gather(leaf, idx) for leaf in leaves])

    arrays.ArraySource.gather_fn = gather_fn


def fit_child(spec: dict, conn) -> None:
    """One training variant of (a), (b) or (d), in its own process; runs only while it holds the turn.

    ``spec["kind"]``: ``tfdist`` (tfdist.fit on arrays), ``tfrecord`` (tfdist.fit on a
    TFRecordSource), ``plain`` (model.fit on a tf.data pipeline) or ``synthetic`` (model.fit
    on one batch repeated); part (f), with Keras 3: ``user tfdist`` (tfdist.fit on a user's own
    pipeline), ``user plain`` (model.fit on the same pipeline) and ``user synthetic``.
    """
    if spec["kind"].startswith("user "):
        return user_fit_child(spec, conn)
    _common.quiet_tensorflow()
    _setup_devices(spec.get("carve"))
    import tensorflow as tf
    import tf_keras

    import tfdist
    from tfdist import strategy as strategy_mod

    w, kind, precision = spec["workload"], spec["kind"], spec["precision"]
    if spec.get("gather_in_graph"):
        _gather_in_graph()
    replicas = len(spec["devices"])
    batch = w["batch"] * replicas
    x, y = _images(batch * w["steps"], w["image"], w["classes"])
    source = None
    if kind == "tfrecord":
        source = _tfrecord_source(x, y, tempfile.mkdtemp(prefix="tfdist-gpu-bench-", dir=spec["dir"]))
    builder = resnet_builder(w)
    turns = _common.Turns(conn)
    sampler = UtilizationSampler(spec.get("sample_utilization", False))
    timer = _timer(turns, sampler)
    turns.start()  # first turn: setup, tracing and the first epoch
    start = time.perf_counter()
    result = {"variant": spec["variant"], "kind": kind}
    if kind in ("tfdist", "tfrecord"):
        try:
            history = tfdist.fit(builder, source or (x, y), epochs=w["epochs"], batch_size=batch,
                                 strategy=spec["strategy"], devices=spec["devices"],
                                 strategy_options=tfdist.StrategyOptions(all_reduce=spec["all_reduce"]),
                                 mixed_precision=None if precision == "float32" else precision, seed=spec["seed"],
                                 verbose=0, callbacks=[timer])
        except tfdist.StrategyError as e:  # e.g. NCCL on logical GPUs or CPUs: the refusal is the result
            turns.finish(dict(result, refused=str(e)))
            return
        assert history.tfdist.num_replicas == replicas, history.tfdist
        if spec["strategy"] == strategy_mod.MIRRORED:  # what fit chose, by the same rule and facts
            result["all_reduce"] = strategy_mod.all_reduce_for(spec["strategy"], requested=spec["all_reduce"],
                                                               devices=spec["devices"]).name
    else:
        tf_keras.utils.set_random_seed(spec["seed"])
        if spec["strategy"] == strategy_mod.ONE_DEVICE:
            strategy = tf.distribute.OneDeviceStrategy(spec["devices"][0])
        else:
            ops = {"nccl": tf.distribute.NcclAllReduce, "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
                   "reduce_to_one": tf.distribute.ReductionToOneDevice}[spec["all_reduce"]]
            strategy = tf.distribute.MirroredStrategy(spec["devices"], cross_device_ops=ops())
        tf_keras.mixed_precision.set_global_policy(precision)
        with strategy.scope():
            model = builder()
        if kind == "synthetic":
            ds = tf.data.Dataset.from_tensors((x[:batch], y[:batch])).repeat().prefetch(tf.data.AUTOTUNE)
        else:
            ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=spec["seed"])
            ds = ds.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
        model.fit(ds, epochs=w["epochs"], steps_per_epoch=w["steps"], verbose=0, callbacks=[timer])
    turns.finish(_timed(result, timer, turns, start, steps=w["steps"], batch=batch, replicas=replicas,
                        utilization=[s for s in sampler.samples if s]))


def _timed(result: dict, timer, turns, start: float, *, steps: int, batch: int, replicas: int,
           utilization: list) -> dict:
    """``result`` with a variant's timings: the step time is the median epoch (the first left out) / steps."""
    import numpy as np

    durations = [e - b for b, e in zip(timer.begin, timer.end)]
    step = float(np.median(durations[1:])) / steps
    return dict(result, step_seconds=step, examples_per_second=batch / step, epoch_seconds=durations,
                first_epoch_seconds=durations[0], call_seconds=time.perf_counter() - start - turns.waited,
                replicas=replicas, global_batch=batch, loss=timer.loss, loss_scale=timer.loss_scale,
                utilization=utilization, params=int(timer.model.count_params()))


def user_fit_child(spec: dict, conn) -> None:
    """One variant of (f): the Keras 3 ResNet on a user's own tf.data pipeline over TFRecord files."""
    _common.quiet_tensorflow()
    import keras
    import tensorflow as tf

    import tfdist

    w, kind, precision = spec["workload"], spec["kind"], spec["precision"]
    batch = w["batch"]
    x, y = _images(batch * w["steps"], w["image"], w["classes"])
    paths = _write_records(x, y, tempfile.mkdtemp(prefix="tfdist-gpu-bench-", dir=spec["dir"]), files=8)
    # Repeated, with steps_per_epoch: Keras' own fit stops a pipeline of unknown length after its first pass.
    pipeline = user_pipeline(paths, list(x.shape[1:]), batch, spec["seed"]).repeat()
    builder = resnet_builder(w, "keras")
    turns = _common.Turns(conn)
    timer = _timer(turns, UtilizationSampler(False))
    turns.start()
    start = time.perf_counter()
    result = {"variant": spec["variant"], "kind": kind}
    if kind == "user tfdist":
        tfdist.fit(builder, pipeline, epochs=w["epochs"], steps_per_epoch=w["steps"], strategy="one_device",
                   devices=spec["devices"],
                   mixed_precision=None if precision == "float32" else precision, seed=spec["seed"], verbose=0,
                   callbacks=[timer])
    else:
        keras.utils.set_random_seed(spec["seed"])
        keras.mixed_precision.set_global_policy(precision)
        with tf.distribute.OneDeviceStrategy(spec["devices"][0]).scope():
            model = builder()
        if kind == "user synthetic":
            data = tf.data.Dataset.from_tensors((x[:batch], y[:batch])).repeat().prefetch(tf.data.AUTOTUNE)
            model.fit(data, epochs=w["epochs"], steps_per_epoch=w["steps"], verbose=0, callbacks=[timer])
        else:
            model.fit(pipeline, epochs=w["epochs"], steps_per_epoch=w["steps"], verbose=0, callbacks=[timer])
    turns.finish(_timed(result, timer, turns, start, steps=w["steps"], batch=batch, replicas=1, utilization=[]))


def plan_fit_child(spec: dict) -> dict:
    """(e): tfdist.fit of the built-in model on generated images, timed as plan_accuracy times it."""
    _common.quiet_tensorflow()
    import plan_accuracy

    from tfdist import models

    x, y = _images(spec["samples"], spec["image"], 10, seed=spec["seed"])
    builder = models.builder(spec["model"], input_shape=(spec["image"], spec["image"], 3), num_classes=10,
                             keras=spec["keras"])
    return plan_accuracy.timed_fit(builder, (x, y), spec)


def child_main(spec: dict) -> None:
    if spec["part"] == "saves":
        import checkpoint

        _common.quiet_tensorflow()
        _common.emit(checkpoint.saves(spec["dir"], reps=spec["reps"], model_name=spec["model"], device=spec["device"]))
    elif spec["part"] == "plan-fit":
        _common.emit(plan_fit_child(spec))
    else:
        raise ValueError(spec)


# --- the parts -----------------------------------------------------------------------------------
@dataclasses.dataclass
class Run:
    """What every part needs: the mode, the sizes, where to write, and what it reports."""

    gpu: bool
    quick: bool
    reps: int
    workload: Workload
    workdir: str
    rows: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)
    results: dict = dataclasses.field(default_factory=dict)

    @property
    def device(self) -> str:
        return "/gpu:0" if self.gpu else "/cpu:0"

    def verdict(self, value: float, target: float, *, below: bool = True) -> str:
        return _common.verdict(value, target, below=below) if self.gpu else "– (CPU stand-in)"

    def lockstep(self, specs: dict[str, dict], what: str) -> dict[str, list[dict]]:
        """``reps`` lockstep repetitions of ``specs``; each variant's results in repetition order."""
        runs: dict[str, list[dict]] = {name: [] for name in specs}
        for rep in range(self.reps):
            seeded = {name: dict(spec, seed=rep) for name, spec in specs.items()}
            for name, r in _common.lockstep(fit_child, seeded, rotation=rep, turn_timeout=900).items():
                runs[name].append(r)
                if "refused" in r:
                    print(f"  ({what}) rep {rep} {name}: refused: {r['refused']}", flush=True)
                else:
                    print(f"  ({what}) rep {rep} {name:28s}: step {r['step_seconds'] * 1e3:.2f} ms, "
                          f"{r['examples_per_second']:,.0f} examples/s, first epoch {r['first_epoch_seconds']:.1f} s"
                          + (f", loss scale {r['loss_scale']:g}" if r.get("loss_scale") else ""), flush=True)
        return runs


def _describe(w: Workload, params: int) -> str:
    return (f"ResNet ({w.blocks} blocks x 3 stages, width {w.width}, {params / 1e6:.2f} M params), "
            f"{w.image}x{w.image}x3 images, batch {w.batch}/replica, {w.steps} steps/epoch, epochs 2–{w.epochs} timed")


def part_a(run: Run, precisions: tuple[str, ...] = PRECISIONS) -> None:
    w = dataclasses.asdict(run.workload)
    base = dict(workload=w, strategy="one_device", devices=[run.device], all_reduce="auto")
    specs = {f"{kind} {precision}": dict(base, variant=f"{kind} {precision}", kind=kind, precision=precision)
             for precision in precisions for kind in ("plain", "tfdist")}
    runs = run.lockstep(specs, "a")
    run.results["a"] = {"runs": runs}
    params = runs[f"tfdist {precisions[0]}"][0]["params"]
    what = _describe(run.workload, params)
    for precision in precisions:
        plain, ours = runs[f"plain {precision}"], runs[f"tfdist {precision}"]
        ratio = _common.paired(plain, ours, "step_seconds")
        run.results["a"][precision] = {"ratio": ratio}
        run.rows.append((
            f"(a) {precision}: step time tfdist / plain `model.fit`, one_device {run.device}; {what}",
            f"**{_common.fmt_ratio(ratio)}**; plain {_common.fmt(_common.summary_of(plain, 'step_seconds'), 1e3, ' ms')} "
            f"({_common.summary_of(plain, 'examples_per_second')['median']:,.0f} examples/s), tfdist "
            f"{_common.fmt(_common.summary_of(ours, 'step_seconds'), 1e3, ' ms')} "
            f"({_common.summary_of(ours, 'examples_per_second')['median']:,.0f} examples/s)",
            f"≤ {TARGET_OVERHEAD}", run.verdict(ratio["median"], TARGET_OVERHEAD)))
    for precision in (p for p in precisions if p != "float32" and "float32" in precisions):
        speedup = _common.paired(runs[f"tfdist {precision}"], runs["tfdist float32"], "step_seconds")
        scale = [r["loss_scale"] for r in runs[f"tfdist {precision}"] if r.get("loss_scale") is not None]
        losses = [r["loss"] for r in runs[f"tfdist {precision}"]]
        run.results["a"][precision]["speedup"] = speedup
        extra = (f"; dynamic loss scale at the end {', '.join(f'{s:g}' for s in scale)}" if scale
                 else "; no loss scaling (bfloat16 has float32's range)")
        run.rows.append((
            f"(a) {precision} speed-up over float32 (tfdist step time float32 / {precision})",
            f"**{_common.fmt_ratio(speedup)}**{extra}; last epoch loss {', '.join(f'{v:.3f}' for v in losses)}",
            "(> 1: report)", "–"))
    run.notes.append(f"(a): {run.reps} repetition(s); the {len(specs)} variants (plain and tfdist x "
                     f"{', '.join(precisions)}) run in fresh "
                     "processes in lockstep, an epoch each in turn; ratios paired by repetition; plain uses "
                     "`.prefetch(AUTOTUNE)` (tfdist's pipeline prefetches too).")


def part_b(run: Run, *, physical_gpus: int, logical: int, memory_mb: int) -> None:
    from tfdist import strategy as strategy_mod

    if run.gpu and physical_gpus >= 2:
        n, carve, kind = physical_gpus, None, f"{physical_gpus} physical GPUs"
    elif run.gpu:
        n, carve = logical, {"type": "GPU", "count": logical, "memory_mb": memory_mb}
        kind = f"{logical} LOGICAL GPUs carved from 1 physical GPU ({memory_mb} MB each)"
    else:
        n, carve, kind = 2, {"type": "CPU", "count": 2}, "2 logical CPU devices (stand-ins)"
    prefix = "/gpu:" if run.gpu else "/cpu:"
    devices = [f"{prefix}{i}" for i in range(n)]
    w = dataclasses.asdict(run.workload)
    base = dict(workload=w, precision="float32", carve=carve, kind="tfdist")
    # The one all-reduce that runs on every kind of machine here, for the plain comparison.
    main_op = "nccl" if carve is None else "reduce_to_one"
    specs = {
        "one device": dict(base, variant="one device", strategy="one_device", devices=devices[:1], all_reduce="auto"),
        "mirrored nccl": dict(base, variant="mirrored nccl", strategy="mirrored", devices=devices, all_reduce="nccl"),
        "mirrored auto": dict(base, variant="mirrored auto", strategy="mirrored", devices=devices, all_reduce="auto"),
        f"plain mirrored {main_op}": dict(base, variant=f"plain mirrored {main_op}", kind="plain", strategy="mirrored",
                                          devices=devices, all_reduce=main_op),
    }
    if carve is not None:
        specs["mirrored reduce_to_one"] = dict(base, variant="mirrored reduce_to_one", strategy="mirrored",
                                               devices=devices, all_reduce="reduce_to_one")
    if n % 2 == 0:  # TensorFlow's hierarchical copy leaves a replica out with an odd count (tfdist refuses it)
        specs["mirrored hierarchical_copy"] = dict(base, variant="mirrored hierarchical_copy", strategy="mirrored",
                                                   devices=devices, all_reduce="hierarchical_copy")
    runs = run.lockstep(specs, "b")
    run.results["b"] = {"runs": runs, "devices": kind}
    one = runs["one device"]
    what = f"{kind}, float32, per-replica batch {run.workload.batch}"
    for name, variant in runs.items():
        if name == "one device" or name.startswith("plain"):
            continue
        if "refused" in variant[0]:
            run.rows.append((f"(b) tfdist `mirrored` all_reduce={name.split()[-1]} on {kind}",
                             f"refused by tfdist (one line): \"{variant[0]['refused']}\"", "–", "–"))
            continue
        efficiency = _common.summary([m["examples_per_second"] / (n * o["examples_per_second"])
                                      for o, m in zip(one, variant)])
        run.results["b"][name] = {"efficiency": efficiency}
        chosen = variant[0].get("all_reduce", "?")
        run.rows.append((
            f"(b) tfdist `mirrored` all_reduce={name.split()[-1]} (ran: {chosen}), {what}: scaling efficiency "
            f"= examples/s / ({n} x one device)",
            f"**{_common.fmt_ratio(efficiency)}**; {_common.fmt(_common.summary_of(variant, 'examples_per_second'), 1, ' examples/s')} "
            f"vs one device {_common.fmt(_common.summary_of(one, 'examples_per_second'), 1, ' examples/s')}",
            "(report)", "–"))
    if "refused" not in runs["mirrored nccl"][0] and "mirrored hierarchical_copy" in runs:
        ratio = _common.paired(runs["mirrored nccl"], runs["mirrored hierarchical_copy"], "step_seconds")
        run.rows.append((f"(b) step time hierarchical_copy / nccl, {what}", f"**{_common.fmt_ratio(ratio)}**",
                         "(report)", "–"))
    ours = runs[f"mirrored {main_op}"]
    if "refused" not in ours[0]:
        ratio = _common.paired(runs[f"plain mirrored {main_op}"], ours, "step_seconds")
        run.results["b"]["overhead"] = ratio
        run.rows.append((f"(b) step time tfdist / plain `model.fit`, `mirrored` with {main_op}, {what}",
                         f"**{_common.fmt_ratio(ratio)}**", f"≤ {TARGET_OVERHEAD}",
                         run.verdict(ratio["median"], TARGET_OVERHEAD)))
    run.notes.append(f"(b): {run.reps} repetition(s), {len(specs)} variants in lockstep; every process "
                     f"{'carves the same logical devices' if carve else 'sees every GPU'}; the all-reduce tfdist "
                     f"ran is the one `tfdist.strategy.all_reduce_for` reports (logged by fit).")
    if carve and carve["type"] == "GPU":
        run.notes.append("(b): LOGICAL GPUs share one physical GPU's compute: the efficiency measures what "
                         "replication and the all-reduce cost, not scaling. Run on a machine with several GPUs "
                         "for scaling figures.")
    if carve is not None:
        reason = (strategy_mod.nccl_unavailable_reason(physical_gpus=1, logical_gpus=n, nccl_kernels=True)
                  if run.gpu else "the replicas are CPU devices")
        run.notes.append(f"(b): NCCL cannot run here: {reason}.")


def part_c(run: Run, script: str, every_steps: int | None) -> None:
    import checkpoint

    model = "wide" if run.gpu else "cnn"
    reps = 1 if run.quick else 5
    a = _common.run_child(script, {"part": "saves", "dir": run.workdir, "reps": reps, "model": model,
                                   "device": run.device}, timeout=1800)
    blocked = {m: _common.summary_of(a["runs"][m], "blocked") for m in ("sync", "async")}
    complete = _common.summary_of(a["runs"]["async"], "complete")
    ratio = _common.summary([x["blocked"] / s["complete"] for s, x in zip(a["runs"]["sync"], a["runs"]["async"])])
    warm = a["warmup"]["async"]  # TensorFlow's first async saves allocate and trace: they block longer
    warm_ms = ", ".join(f"{w['blocked'] * 1e3:.0f}" for w in warm)
    run.results["c_saves"] = dict(a, blocked=blocked, ratio=ratio)
    run.rows.append((
        f"(c) async save blocked / sync save, \"{model}\" + Adam, {a['params'] / 1e6:.1f} M params, "
        f"{a['checkpoint_bytes'] / 1e6:.0f} MB, state on {a['state_device']}",
        f"**{_common.fmt_ratio(ratio)}**; async save() returns in {_common.fmt(blocked['async'], 1e3, ' ms')}"
        f"{' (the device-to-host copy)' if run.gpu else ''}, sync save {_common.fmt(blocked['sync'], 1, ' s')}; async complete "
        f"{_common.fmt(complete, 1, ' s')}; the run's first {len(warm)} async saves (warm-up, not in the ratio) "
        f"blocked {warm_ms} ms",
        f"≤ {TARGET_ASYNC_BLOCK}", run.verdict(ratio["median"], TARGET_ASYNC_BLOCK)))
    if run.gpu:
        spec = dict(features=32, width=7000, depth=2, batch=128, every=every_steps or (200 if run.quick else 2000),
                    turns=2 if run.quick else 4, warmup=3, dir=run.workdir)
    else:
        spec = dict(features=16, width=64, depth=1, batch=16, every=every_steps or 20, turns=2, warmup=1,
                    dir=run.workdir)
    runs = {"none": [], "save": []}
    for rep in range(1 if run.quick else 3):
        specs = {v: dict(spec, variant=v) for v in runs}
        for variant, r in _common.lockstep(checkpoint.throughput_child, specs, rotation=rep, linger=5).items():
            runs[variant].append(r)
            print(f"  (c) rep {rep} {variant:4s}: {r['steps_per_second']:.1f} steps/s", flush=True)
    loss = _common.summary([1 - s["steps_per_second"] / n["steps_per_second"] for n, s in zip(runs["none"], runs["save"])])
    sps = {v: _common.summary_of(runs[v], "steps_per_second") for v in runs}
    run.results["c_throughput"] = {"spec": spec, "runs": runs, "loss": loss}
    seconds = spec["every"] / sps["none"]["median"]
    run.rows.append((
        f"(c) throughput loss, a save every {spec['every']} steps (~{seconds:.3g} s) vs none; MLP "
        f"{spec['features']}-{'-'.join([str(spec['width'])] * spec['depth'])}-10 "
        f"({runs['save'][0]['params'] / 1e6:.1f} M params, {runs['save'][0]['checkpoint_bytes'] / 1e6:.0f} MB "
        f"checkpoint) on {run.device}, batch {spec['batch']}",
        f"**{_common.fmt(loss, 100, ' %')}**; {_common.fmt(sps['none'], 1, ' steps/s')} without, "
        f"{_common.fmt(sps['save'], 1, ' steps/s')} with saves",
        f"≤ {TARGET_THROUGHPUT_LOSS * 100:g} %", run.verdict(loss["median"], TARGET_THROUGHPUT_LOSS)))
    run.notes.append("(c): benchmarks/checkpoint.py's `saves` (its part a) in a fresh process with the model on "
                     f"{run.device}, and its lockstep `throughput_child` (its part b: turns pass at steps kN + N/2, "
                     f"{spec['warmup']} stretch(es) with a save untimed first); tfdist's one_device takes GPU:0 "
                     "when there is one.")


def _stall(runs: dict, synthetic: list, name: str) -> tuple[dict, str]:
    """Variant ``name``'s stall against ``synthetic`` (paired by repetition), and the cell that shows it."""
    stall = _common.summary([1 - s["step_seconds"] / t["step_seconds"] for s, t in zip(synthetic, runs[name])])
    cell = (f"**{_common.fmt(stall, 100, ' %')}**; this {_common.fmt(_common.summary_of(runs[name], 'step_seconds'), 1e3, ' ms')}, "
            f"synthetic {_common.fmt(_common.summary_of(synthetic, 'step_seconds'), 1e3, ' ms')}")
    return stall, cell


def part_d(run: Run, precision: str, *, gather: bool = True) -> None:
    import tfdist

    w = dataclasses.asdict(run.workload)
    base = dict(workload=w, strategy="one_device", devices=[run.device], all_reduce="auto", precision=precision,
                sample_utilization=run.gpu, dir=run.workdir)
    specs = {"tfdist arrays": dict(base, variant="tfdist arrays", kind="tfdist"),
             **({"tfdist graph gather": dict(base, variant="tfdist graph gather", kind="tfdist", gather_in_graph=True)}
                if gather else {}),
             "plain tf.data": dict(base, variant="plain tf.data", kind="plain"),
             "synthetic": dict(base, variant="synthetic", kind="synthetic")}
    files = hasattr(tfdist, "TFRecordSource")
    if files:
        specs["tfdist TFRecord"] = dict(base, variant="tfdist TFRecord", kind="tfrecord")
    runs = run.lockstep(specs, "d")
    run.results["d"] = {"runs": runs}
    synthetic = runs["synthetic"]
    for name in ("tfdist arrays", "tfdist graph gather", "plain tf.data", "tfdist TFRecord"):
        if name == "tfdist graph gather" and not gather:
            continue
        if name not in runs:
            run.rows.append(("(d) input stall with tfdist's TFRecord file source",
                             "not measured: this tfdist has no `tfdist.TFRecordSource` (built on another branch; "
                             "the row appears when `hasattr(tfdist, \"TFRecordSource\")`)", "–", "–"))
            continue
        stall, cell = _stall(runs, synthetic, name)
        run.results["d"][name] = {"stall": stall}
        utilization = [v for r in runs[name] for epoch in r["utilization"] for v in epoch]
        util = (f"; nvidia-smi utilization.gpu {sum(utilization) / len(utilization):.0f} % "
                f"(mean of {len(utilization)} samples)" if utilization else "; nvidia-smi: n/a")
        source = {"tfdist arrays": "tfdist's pipeline on in-memory arrays",
                  "tfdist graph gather": "tfdist's pipeline on in-memory arrays read by `tf.gather` from CPU tensors "
                                         "instead of `tf.numpy_function` (benchmark-only variant)",
                  "plain tf.data": "plain `model.fit` on `from_tensor_slices(...).shuffle().batch().prefetch()` "
                                   "((a)'s baseline)",
                  "tfdist TFRecord": "tfdist's pipeline on a TFRecord file (`tfdist.TFRecordSource`)"}[name]
        run.rows.append((
            f"(d) input stall, {source}: 1 - synthetic step / this step, {precision}, "
            f"one_device {run.device}, batch {run.workload.batch}",
            cell + util,
            "(≈ 0: report)", "–"))
    ratio = _common.paired(runs["plain tf.data"], runs["tfdist arrays"], "step_seconds")
    run.results["d"]["tfdist / plain"] = ratio
    versus_gather = (f"; `tf.gather` variant / tfdist's reader "
                     f"{_common.fmt_ratio(_common.paired(runs['tfdist arrays'], runs['tfdist graph gather'], 'step_seconds'))}"
                     if gather else "")
    run.rows.append((
        f"(d) step time tfdist / plain `model.fit` ((a)'s figure, measured again beside (d)'s variants), {precision}",
        f"**{_common.fmt_ratio(ratio)}**{versus_gather}",
        f"≤ {TARGET_OVERHEAD}", run.verdict(ratio["median"], TARGET_OVERHEAD)))
    run.notes.append("(d): synthetic = plain `model.fit` on `Dataset.from_tensors(one batch).repeat().prefetch()` (still copied "
                     "to the device each step, as any input is); a stall near 0 means tfdist's pipeline keeps the "
                     f"GPU fed. The TFRecord row {'ran' if files else 'did not run: no tfdist.TFRecordSource here'}.")


def part_f(run: Run, precision: str) -> None:
    w = dataclasses.asdict(run.workload)
    base = dict(workload=w, devices=[run.device], precision=precision, dir=run.workdir)
    specs = {name: dict(base, variant=name, kind=name) for name in ("user tfdist", "user plain", "user synthetic")}
    runs = run.lockstep(specs, "f")
    run.results["f"] = {"runs": runs}
    synthetic = runs["user synthetic"]
    for name, what in (("user tfdist", "`tfdist.fit`"), ("user plain", "Keras 3's own `model.fit`")):
        stall, cell = _stall(runs, synthetic, name)
        run.results["f"][name] = {"stall": stall}
        run.rows.append((
            f"(f) input stall of a user's own tf.data pipeline (8 TFRecord files, `map(parse)`, `shuffle(2048)`, "
            f"`batch({run.workload.batch}, drop_remainder=True)`, `prefetch`, `repeat`) under {what}: 1 - synthetic step / "
            f"this step, Keras 3, {precision}, one_device {run.device}",
            cell, "(≈ 0: report)", "–"))
    ratio = _common.paired(runs["user plain"], runs["user tfdist"], "step_seconds")
    run.results["f"]["tfdist / plain"] = ratio
    run.rows.append((f"(f) step time on that pipeline, `tfdist.fit` / Keras 3's `model.fit`, {precision}",
                     f"**{_common.fmt_ratio(ratio)}**", f"≤ {TARGET_OVERHEAD}", run.verdict(ratio["median"], TARGET_OVERHEAD)))
    run.notes.append("(f): synthetic = Keras 3's `model.fit` on `Dataset.from_tensors(one batch).repeat().prefetch()`. "
                     "`tfdist.fit` reads the user's pipeline through its own iterator; no checkpoint directory is "
                     "given, as in (d), so the figure is the input path alone.")


def part_e(run: Run, script: str) -> None:
    import plan_accuracy

    image = run.workload.image
    configs = ("cnn:256:1:6", "cnn:128:2:6") if run.gpu else ("cnn:16:1:3",)
    if run.gpu and run.quick:
        configs = ("cnn:256:1:3",)
    steps = run.workload.steps
    for config in configs:
        model, micro, accum, epochs = config.split(":")
        # Keras 3, the default Keras of tfdist train and plan: planned and trained alike.
        spec = dict(model=model, micro=int(micro), accum=int(accum), epochs=int(epochs), keras="3")
        samples = spec["micro"] * spec["accum"] * steps
        extra = ("--input-shape", f"{image},{image},3", "--num-classes", "10")
        runs = {"plan": [], "fit": []}
        for rep, variant in _common.alternate(("plan", "fit"), run.reps):
            if variant == "plan":
                r = plan_accuracy.run_plan(spec, samples=samples, extra=extra)
            else:
                r = _common.run_child(script, dict(spec, part="plan-fit", image=image, samples=samples, seed=rep),
                                      timeout=1800)
            runs[variant].append(r)
            print(f"  (e) {config} rep {rep} {variant}: epoch {r['epoch_seconds']:.3f} s", flush=True)
        ratio = _common.paired(runs["fit"], runs["plan"], "epoch_seconds")
        run.results.setdefault("e", {})[config] = {"runs": runs, "ratio": ratio}
        what = f"{model}, micro batch {micro}" + (f" x {accum} accumulation steps" if spec["accum"] > 1 else "")
        run.rows.append((
            f"(e) `tfdist plan --measure` predicted / measured epoch time, {what}, {image}x{image}x3 inputs, "
            f"{runs['fit'][0]['steps_per_epoch']} steps/epoch on {run.device}",
            f"**{_common.fmt_ratio(ratio)}** ({ratio['median'] - 1:+.0%}); predicted "
            f"{_common.fmt(_common.summary_of(runs['plan'], 'epoch_seconds'), 1e3, ' ms')}, measured (epochs 2–{epochs}) "
            f"{_common.fmt(_common.summary_of(runs['fit'], 'epoch_seconds'), 1e3, ' ms')}",
            f"±{TARGET_PLAN:.0%}", run.verdict(abs(ratio["median"] - 1), TARGET_PLAN)))
    run.notes.append("(e): plan = `tfdist plan --model cnn --keras 3 --input-shape ... --measure --strategy one_device "
                     "--json` in a fresh process, fit = `tfdist.fit` of the Keras 3 model in another, alternated.")


# --- the machine and the entry point -------------------------------------------------------------
def gpu_description() -> list[str]:
    """Each GPU: TensorFlow's device details, and nvidia-smi's name, memory and driver when it exists."""
    import tensorflow as tf

    lines = []
    for gpu in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(gpu)
        capability = ".".join(str(v) for v in details.get("compute_capability") or ())
        lines.append(f"{gpu.name}: {details.get('device_name', '?')}, compute capability {capability or '?'}")
    if shutil.which("nvidia-smi"):
        proc = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
        lines += [f"nvidia-smi: {line.strip()}" for line in proc.stdout.splitlines() if line.strip()]
    return lines


def main() -> int:
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--allow-cpu", action="store_true",
                   help="without a GPU, run every part on the CPU with tiny sizes (tests the script; numbers meaningless)")
    p.add_argument("--parts", default="abcdef", help="which parts to run (default abcdef)")
    _common.add_reps_option(p, default=3, what="lockstep repetitions", small="--quick and --allow-cpu")
    p.add_argument("--logical-gpus", type=int, default=2, help="(b) with one physical GPU: logical GPUs carved from it")
    p.add_argument("--logical-gpu-memory", type=int, default=6144, metavar="MB", help="(b) memory of each logical GPU")
    p.add_argument("--every", type=int, default=None, help="(c) save every N steps (default 2000; --quick 200)")
    p.add_argument("--input-precision", default="mixed_float16", choices=PRECISIONS,
                   help="(d) precision of the input-stall runs on a GPU (the fastest step stresses the input most)")
    p.add_argument("--precisions", default=",".join(PRECISIONS),
                   help="(a) the precisions to compare, comma-separated (default all three; a speed-up needs float32)")
    p.add_argument("--no-gather", action="store_true",
                   help="(d) leave out the benchmark-only `tf.gather` reader variant (one process fewer per repetition)")
    p.add_argument("--dir", default=None, help="directory for checkpoints and files (default: a temporary one)")
    args = p.parse_args()
    precisions = tuple(v.strip() for v in args.precisions.split(",") if v.strip())
    if not precisions or set(precisions) - set(PRECISIONS):
        p.error(f"--precisions: expected a comma-separated subset of {', '.join(PRECISIONS)}, got {args.precisions!r}")
    if args.child:
        child_main(json.loads(args.child))
        return 0
    _common.quiet_tensorflow()
    os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")  # the variants' processes share the GPU
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus and not args.allow_cpu:
        print("benchmarks/gpu.py: no GPU on this machine (TensorFlow lists none): nothing measured. "
              "Run it on a machine with a GPU, or pass --allow-cpu to run the same code on the CPU with tiny "
              "sizes (a check of the script; its numbers mean nothing).")
        return 0
    gpu = bool(gpus)
    info = _common.machine()
    info["gpu_details"] = gpu_description() if gpu else []
    print("machine:", _common.describe_machine(info), flush=True)
    for line in info["gpu_details"]:
        print("  ", line, flush=True)
    if not gpu:
        print(f"benchmarks/gpu.py: no GPU; --allow-cpu: {CPU_NOTE}.", flush=True)
    base = args.dir or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    run = Run(gpu=gpu, quick=args.quick, reps=args.reps or (1 if args.quick or not gpu else 3),
              workload=workloads(gpu=gpu, quick=args.quick), workdir=tempfile.mkdtemp(prefix="tfdist-gpu-bench-", dir=base))
    if not gpu:
        run.notes.append(f"**{CPU_NOTE}.** It only shows that every code path of the script runs.")
    script = os.path.abspath(__file__)
    try:
        if "a" in args.parts:
            part_a(run, precisions)
        if "b" in args.parts:
            part_b(run, physical_gpus=len(gpus), logical=args.logical_gpus, memory_mb=args.logical_gpu_memory)
        if "c" in args.parts:
            part_c(run, script, args.every)
        if "d" in args.parts:
            part_d(run, args.input_precision if gpu else "float32", gather=not args.no_gather)
        if "e" in args.parts:
            part_e(run, script)
        if "f" in args.parts:
            part_f(run, args.input_precision if gpu else "float32")
    finally:
        shutil.rmtree(run.workdir, ignore_errors=True)
    if gpu:
        run.notes.append("GPUs: " + "; ".join(info["gpu_details"]) + ".")
    flags = [f for f, on in (("--quick", args.quick), ("--allow-cpu", args.allow_cpu)) if on]
    if args.parts != "abcdef":
        flags.append(f"--parts {args.parts}")
    if args.no_gather:
        flags.append("--no-gather")
    for flag, value, default in (("--reps", args.reps, None), ("--logical-gpus", args.logical_gpus, 2),
                                 ("--logical-gpu-memory", args.logical_gpu_memory, 6144), ("--every", args.every, None),
                                 ("--input-precision", args.input_precision, "mixed_float16"),
                                 ("--precisions", ",".join(precisions), ",".join(PRECISIONS))):
        if value != default:
            flags.append(f"{flag} {value}")
    title = "GPU paths (benchmarks/gpu.py)" + ("" if gpu else f" -- {CPU_NOTE}")
    _common.finish(title=title, info=info, command=" ".join(["python benchmarks/gpu.py", *flags]),
                   results=run.results, rows=run.rows, notes=run.notes, args=args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
