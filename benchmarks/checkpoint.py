"""Checkpoint costs: async blocking, throughput with saves, save bandwidth, resume latency.

Five figures, each measured side by side in this one run (variants alternated):

(a) Blocking per save, async vs sync, on the built-in "wide" model with Adam (checkpoint
    >= 500 MB; its size on disk is reported). Saves go through tfdist's own
    ``Checkpointer`` (``tf.train.CheckpointManager`` + ``CheckpointOptions(enable_async=...)``),
    exactly as ``tfdist.fit`` calls it. Blocked = until ``save()`` returns; the sync save's
    blocked time is its whole duration; the async save's complete time runs until
    ``sync()`` returns. Target: async blocked <= 5% of the sync save.
(b) Training throughput of ``tfdist.fit`` with ``checkpoint_dir`` and ``save_every_steps=N``
    vs no checkpoint_dir, on a mid-size MLP. The two runs go in lockstep (fresh processes,
    one trains while the other waits), passing the turn at steps kN + N/2: each timed
    stretch of N steps holds exactly one save. The first ``--b-warmup`` (2) stretches with a
    save are left untimed (a process's first async saves pay one-time costs, reported apart),
    so the figure is the steady state of a long run. Target: <= 3.5% loss.
(c) Save bandwidth = checkpoint bytes / complete save time, vs the disk's sequential write
    bandwidth measured in the same run by writing a file of the same size with ``os.write``
    (16 MiB chunks of random bytes). TensorFlow does not fsync checkpoint files, so the
    figure is given twice: page cache (no fsync on either side) and durable (fsync after
    both: the checkpoint's files are fsynced after ``save`` returns). The headline save time
    ends when the checkpoint's files are complete (the Checkpointer's write callback), before
    the manager deletes the checkpoint that falls out of ``keep``; the whole save, deletion
    included, is reported too. Target: >= 0.8.
(d) Resume latency of the data path at step 100,000 vs step 10 of ONE epoch: the time of
    ``dataset_fn(source, plan, start_step=S, stop_step=...)`` + ``iter`` + the first batch,
    on an in-memory source of (100,010 + 1,000) x batch examples; the naive ``skip(S)`` of a
    pipeline started at 0 is timed for context. Target: ratio <= 1.5.
(e) End-to-end: ``tfdist.fit`` resuming from a checkpoint at step 100,000 vs step 10 (same
    run, one epoch of 101,010 steps), timed from the call to the end of the first step, each
    in a fresh process. ckpt-10 comes from a real run; the step-100,000 checkpoint is the
    same state re-saved with the progress counters at 100,000.

    python benchmarks/checkpoint.py [--quick] [--json PATH] [--markdown PATH] [--dir DIR]
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

TARGET_ASYNC_BLOCK = 0.05
TARGET_THROUGHPUT_LOSS = 0.035
TARGET_BANDWIDTH = 0.8
TARGET_RESUME = 1.5
CHUNK = 16 << 20


def _fsync(paths) -> None:
    """fsync each file or directory of ``paths``."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _checkpoint_bytes(prefix: str) -> int:
    from tfdist.checkpoint.layout import checkpoint_files

    return sum(os.path.getsize(p) for p in checkpoint_files(prefix))


# --- (a) + (c): blocking and bandwidth on the wide model ---------------------------------------
def model_checkpointers(directories: dict[str, str], model_name: str, device: str = "/cpu:0"):
    """The built-in ``model_name`` + Adam with its state on ``device``, after one training step (non-zero
    optimizer slots, as in a real run), and one chief Checkpointer of its state per entry of
    ``directories`` (``{"sync" | "async": directory}``): ``(model, {mode: Checkpointer})``."""
    import tensorflow as tf

    from tfdist import checkpoint as ckpt_mod
    from tfdist import models
    from tfdist.data import load_digits
    from tfdist.training import model as keras_model

    train, _ = load_digits()
    strategy = tf.distribute.OneDeviceStrategy(device)
    adapter, model = keras_model.resolve(models.builder(model_name, input_shape=train.example_shape, num_classes=10,
                                                        keras="2"),
                                         strategy)
    adapter.prepare(model, sample=train.sample(32), grad_accum_steps=1)
    model.train_on_batch(*train.sample(32))
    checkpointers = {}
    for mode, directory in directories.items():
        options = ckpt_mod.CheckpointOptions(directory=directory, keep=2, async_save=mode == "async")
        checkpointers[mode] = ckpt_mod.Checkpointer(
            options=options, state=adapter.state(model), strategy=strategy,
            is_chief=True, task_name="chief:0",
            run_metadata=ckpt_mod.RunMetadata(global_batch_size=32, data_fingerprint="digits",
                                              model_fingerprint=model_name, seed=0),
        )
    return model, checkpointers


def saves(workdir: str, reps: int, model_name: str, device: str = "/cpu:0") -> dict:
    """(a)/(c) with the model's state on ``device`` (benchmarks/gpu.py passes a GPU)."""
    import numpy as np

    from tfdist.checkpoint.layout import checkpoint_files as layout_files

    model, checkpointers = model_checkpointers({mode: os.path.join(workdir, mode) for mode in ("sync", "async")},
                                               model_name, device)
    params = int(model.count_params())
    step = [0]

    def save(mode: str) -> dict:
        ck = checkpointers[mode]
        step[0] += 1
        t0 = time.perf_counter()
        path = ck.save(global_step=step[0], epoch=0, step_in_epoch=step[0], history=[])
        t1 = time.perf_counter()
        ck.sync()
        t2 = time.perf_counter()
        files = layout_files(path)
        _fsync([*files, ck.directory])
        t3 = time.perf_counter()
        # written: until the checkpoint's files were complete (the Checkpointer's write callback),
        # i.e. without the manager deleting the checkpoint that falls out of `keep`.
        written = ck.last_written_at - t0
        return {"blocked": t1 - t0, "complete": t2 - t0, "durable": t3 - t0, "written": written,
                "written_durable": written + (t3 - t2), "bytes": _checkpoint_bytes(path)}

    def plain_write() -> dict:
        """tf.train.Checkpoint.write of the same objects: TensorFlow's serialization alone (no
        manager, no deletion of an old checkpoint); then fsync, then the files are deleted (timed)."""
        prefix = os.path.join(workdir, "plain-write", "ckpt")
        t0 = time.perf_counter()
        path = checkpointers["sync"].root.write(prefix)
        t1 = time.perf_counter()
        files = layout_files(path)
        _fsync([*files, os.path.dirname(prefix)])
        t2 = time.perf_counter()
        size = _checkpoint_bytes(path)
        for f in files:
            os.remove(f)
        t3 = time.perf_counter()
        return {"complete": t1 - t0, "durable": t2 - t0, "delete": t3 - t2, "bytes": size}

    raw_path = os.path.join(workdir, "raw-write.bin")

    def raw_write(size: int, payload: bytes) -> dict:
        t0 = time.perf_counter()
        fd = os.open(raw_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            written = 0
            while written < size:
                written += os.write(fd, payload[: min(CHUNK, size - written)])
            t1 = time.perf_counter()
            os.fsync(fd)
        finally:
            os.close(fd)
        t2 = time.perf_counter()
        os.remove(raw_path)
        t3 = time.perf_counter()
        return {"complete": t1 - t0, "durable": t2 - t0, "delete": t3 - t2, "bytes": size}

    # Warm-up (discarded), three saves of each mode. TensorFlow's first async save makes the host
    # copies and fills them eagerly, the second traces the tf.function that copies from then on.
    # With a 594 MB state on an H100, saves 1-3 blocked 0.54-0.64 s each and the 4th 38 ms
    # (benchmarks/device/save_profile.py); with one warm-up save the timed one still blocked 0.58 s.
    first = {mode: [save(mode) for _ in range(3)] for mode in ("sync", "async")}
    size = first["sync"][0]["bytes"]
    payload = np.random.default_rng(0).integers(0, 256, CHUNK, dtype=np.uint8).tobytes()
    runs = {"sync": [], "async": [], "raw": [], "write": []}
    for rep, variant in _common.alternate(("sync", "async", "raw", "write"), reps):
        r = raw_write(size, payload) if variant == "raw" else plain_write() if variant == "write" else save(variant)
        runs[variant].append(r)
        print(f"  (a/c) rep {rep} {variant:5s}: " + ", ".join(
            f"{k} {v:.3f} s" for k, v in r.items() if k != "bytes") + f" ({r['bytes'] / 1e6:.0f} MB)", flush=True)
    for ck in checkpointers.values():
        ck.close()
    return {"model": model_name, "params": params, "checkpoint_bytes": size, "warmup": first, "runs": runs,
            "state_device": model.weights[0].device}


# --- (b): throughput with saves --------------------------------------------------------------
def mid_model_builder(features: int, width: int, depth: int):
    def build():
        import tf_keras

        from tfdist import models

        layers = [tf_keras.Input(shape=(features,))]
        layers += [tf_keras.layers.Dense(width, activation="relu") for _ in range(depth)]
        layers += [tf_keras.layers.Dense(10)]
        return models.compile_default(tf_keras.Sequential(layers, name="mid_mlp"), keras="2")

    return build


def throughput_child(spec: dict, conn) -> None:
    """One variant of (b) in lockstep with the other: the turn passes at steps kN + N/2, so
    every timed turn holds N steps and, with saves, exactly one save (at step kN) in its
    middle. Before passing the turn the saving process waits until that save's background
    write (and the deletion of the oldest checkpoint) is done, so none of its work runs in
    the other's turn; the wait is counted in its own time (conservative)."""
    _common.quiet_tensorflow()
    import numpy as np
    import tensorflow as tf
    import tf_keras

    import tfdist

    every, turns_timed, batch, warmup = spec["every"], spec["turns"], spec["batch"], spec["warmup"]
    # First turn: setup .. N/2; then `warmup` untimed stretches (each with one save: the first
    # async saves of a process pay one-time costs); last: the epoch-end save.
    steps = (turns_timed + warmup + 1) * every
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * batch, spec["features"])).astype(np.float32)
    y = rng.integers(0, 10, steps * batch).astype(np.int32)
    directory = tempfile.mkdtemp(prefix="tfdist-bench-ckpt-", dir=spec["dir"]) if spec["variant"] == "save" else None
    keep = 3
    turns = _common.Turns(conn)
    marks = {"turns": [], "write_waits": [], "warmup_turns": []}

    def wait_for_write(step: int) -> float:
        """Seconds until ckpt-<step> is the latest complete checkpoint and old ones are swept."""
        t0 = time.perf_counter()
        saves = step // every
        while True:
            state = tf.train.get_checkpoint_state(directory)
            latest = state.model_checkpoint_path if state else ""
            if latest.endswith(f"ckpt-{step}") and len(glob.glob(os.path.join(directory, "ckpt-*.index"))) <= min(saves, keep):
                return time.perf_counter() - t0
            if time.perf_counter() - t0 > 300:
                raise RuntimeError(f"ckpt-{step} was not written within 300 s (latest: {latest!r})")
            time.sleep(0.001)

    class Turner(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self._supports_tf_logs = True  # no host sync per batch that tfdist's run does not have
            self.turn_start = None
            self.last_step = 0

        def on_train_batch_end(self, batch_index, logs=None):
            step = self.last_step = batch_index + 1
            if step % every != every // 2 or step >= steps:
                return
            if directory is not None and step > every:  # the save at step - N/2 must have landed
                marks["write_waits"].append(wait_for_write(step - every // 2))
            now = time.perf_counter()
            if self.turn_start is not None:
                warming = len(marks["warmup_turns"]) < warmup
                marks["warmup_turns" if warming else "turns"].append(now - self.turn_start)
            self.turn_start = turns.pass_turn()

        def on_epoch_end(self, epoch, logs=None):  # after tfdist's callback: the epoch-end save was launched
            # The result goes now: what fit does after its last epoch (the final sync, and a tf.data
            # teardown that can take tens of seconds, see RESULTS.md) is not measured, and the
            # process is killed if it lingers.
            from tfdist.checkpoint.layout import checkpoint_paths

            assert self.last_step == steps and len(marks["turns"]) == turns_timed, (self.last_step, marks)
            saved = checkpoint_paths(directory) if directory else []
            turns.finish({
                "variant": spec["variant"],
                "steps_per_second": turns_timed * every / sum(marks["turns"]),
                "turn_seconds": marks["turns"],
                "warmup_turn_seconds": marks["warmup_turns"],
                "write_wait_seconds": marks["write_waits"],
                "global_step": self.last_step,
                "checkpoint_bytes": _checkpoint_bytes(saved[-1]) if saved else 0,
                "params": int(self.model.count_params()),
            })

    kwargs = dict(checkpoint_dir=directory, save_every_steps=every,
                  checkpoint_options=tfdist.CheckpointOptions(keep=keep)) if directory else {}
    turns.start()
    tfdist.fit(mid_model_builder(spec["features"], spec["width"], spec["depth"]), (x, y), epochs=1,
               batch_size=batch, strategy="one_device", seed=0, verbose=0, callbacks=[Turner()], **kwargs)


# --- (d): resume latency of the data path ------------------------------------------------------
def resume(reps: int, naive_reps: int, far: int, near: int, batch: int) -> dict:
    import numpy as np

    from tfdist import data as data_mod
    from tfdist.data import order as order_mod

    steps = far + 10 + 1000
    n = steps * batch
    rng = np.random.default_rng(0)
    source = data_mod.ArraySource(rng.standard_normal((n, 4)).astype(np.float32), rng.integers(0, 10, n).astype(np.int32))
    sizes = data_mod.BatchSizes.resolve(num_replicas=1, batch_size=batch)
    plan = data_mod.DataPlan(sizes=sizes, steps_per_epoch=data_mod.steps_per_epoch_for(source, sizes, None), epochs=1, seed=0)
    assert plan.steps_per_epoch > far + 10, plan

    def first_batch(start: int, naive: bool):
        t0 = time.perf_counter()
        if naive:
            ds = data_mod.dataset_fn(source, plan, start_step=0, stop_step=plan.total_steps)(None).skip(start)
        else:
            ds = data_mod.dataset_fn(source, plan, start_step=start, stop_step=plan.total_steps)(None)
        x, _ = next(iter(ds))
        return time.perf_counter() - t0, x.numpy()

    # The expected first batch of step S: positions [S*B, (S+1)*B) of the epoch's permutation.
    order = order_mod.epoch_permutation(n, plan.seed, 0, True).numpy()
    expected = {s: source.x[order[s * batch:(s + 1) * batch]] for s in (near, far)}
    first_batch(near, False)  # warm-up (discarded)
    runs = {f"start {near}": [], f"start {far}": [], f"skip {near}": [], f"skip {far}": []}
    for rep, start in _common.alternate((near, far), reps):
        seconds, x = first_batch(start, False)
        assert np.array_equal(x.reshape(expected[start].shape), expected[start]), "wrong first batch"
        runs[f"start {start}"].append(seconds)
        print(f"  (d) rep {rep} dataset_fn(start_step={start}): {seconds:.3f} s", flush=True)
    for rep, start in _common.alternate((near, far), naive_reps):
        seconds, x = first_batch(start, True)
        assert np.array_equal(x.reshape(expected[start].shape), expected[start]), "wrong first batch (skip)"
        runs[f"skip {start}"].append(seconds)
        print(f"  (d) rep {rep} naive skip({start}): {seconds:.3f} s", flush=True)
    return {"examples": n, "batch": batch, "steps_per_epoch": plan.steps_per_epoch, "near": near, "far": far,
            "runs": runs, "source_mb": (source.x.nbytes + source.y.nbytes) / 1e6}



# --- (e): end-to-end resume latency of tfdist.fit ----------------------------------------------
def _e2e_data(steps: int, batch: int):
    import numpy as np

    rng = np.random.default_rng(1)
    n = steps * batch
    return rng.standard_normal((n, 4)).astype(np.float32), rng.integers(0, 10, n).astype(np.int32)


def e2e_child(spec: dict) -> None:
    _common.emit(e2e_step(spec))


def e2e_step(spec: dict) -> dict:
    """create: a real run stopped after 10 steps (ckpt-10). move: the same state re-saved as
    step ``far`` (only the progress counters differ). resume: time ``tfdist.fit`` from the call
    to the end of its first training step (in a fresh process: ``e2e_child``)."""
    _common.quiet_tensorflow()
    import tensorflow as tf
    import tf_keras

    import tfdist
    from tfdist import checkpoint as ckpt_mod
    from tfdist import data as data_mod
    from tfdist import models
    from tfdist.checkpoint import layout
    from tfdist.training import model as keras_model

    x, y = _e2e_data(spec["steps"], spec["batch"])
    builder = models.builder("linear", input_shape=(4,), num_classes=10, keras="2")
    directory = spec["dir"]
    if spec["mode"] == "move":
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
        adapter, model = keras_model.resolve(builder, strategy)
        adapter.prepare(model, sample=(x[:32], y[:32]), grad_accum_steps=1)
        metadata = layout.latest_metadata(directory)
        ck = ckpt_mod.Checkpointer(
            options=ckpt_mod.CheckpointOptions(directory=directory, keep=1), state=adapter.state(model),
            strategy=strategy, is_chief=True, task_name="chief:0", run_metadata=metadata.run(),
        )
        assert ck.restore().global_step == 10
        ck.save(global_step=spec["far"], epoch=0, step_in_epoch=spec["far"], history=metadata.history)
        ck.close()
        return {"mode": "move", "latest": layout.checkpoint_paths(directory)[-1]}
    marks = {}

    class Interrupted(Exception):
        pass

    class Stop(tf_keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):  # logs arrive as NumPy: the step has finished
            if "first" not in marks:
                marks["first"] = time.perf_counter()
            if spec["mode"] == "resume":
                self.model.stop_training = True
            elif batch + 1 >= 10:
                # An exception, as a killed run: a callback's stop_training would mark the run
                # complete (EarlyStopping), and a resume would then train nothing.
                raise Interrupted()

    source = data_mod.ArraySource(x, y)
    start = time.perf_counter()
    options = dict(epochs=1, batch_size=spec["batch"], strategy="one_device", seed=0, verbose=0, callbacks=[Stop()],
                   checkpoint_dir=directory, save_every_steps=10)
    if spec["mode"] == "create":
        try:
            tfdist.fit(builder, source, **options)
        except Interrupted:
            pass
        return {"mode": "create", "global_step": layout.latest_metadata(directory).global_step}
    history = tfdist.fit(builder, source, **options)
    return {"mode": spec["mode"], "start_step": history.tfdist.start_step,
            "global_step": history.tfdist.global_step, "to_first_step": marks["first"] - start,
            "call_seconds": time.perf_counter() - start}


def e2e(workdir: str, reps: int, far: int, batch: int, quick: bool = False) -> dict:
    script = os.path.abspath(__file__)
    steps = far + 10 + 1000
    base = {"steps": steps, "batch": batch, "far": far}
    near_dir, far_dir = os.path.join(workdir, "e2e-10"), os.path.join(workdir, "e2e-far")
    # The two checkpoints are made in this process (it trains nothing after them); the timed
    # resumes run in fresh processes.
    created = e2e_step(dict(base, mode="create", dir=near_dir))
    assert created["global_step"] == 10, created
    shutil.copytree(near_dir, far_dir)
    e2e_step(dict(base, mode="move", dir=far_dir))

    def resume_at(rep: int, at: int) -> dict:
        copy = os.path.join(workdir, f"e2e-run-{rep}-{at}")
        shutil.copytree(near_dir if at == 10 else far_dir, copy)  # the timed run saves again: use a copy
        r = _common.run_child(script, dict(base, mode="resume", dir=copy))
        shutil.rmtree(copy, ignore_errors=True)
        assert r["start_step"] == at, r
        return r

    order = _common.alternate((10, far), reps)
    if quick:  # only checks the code runs: the resumes run at the same time, their timings mean nothing
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(order)) as pool:
            results = list(pool.map(lambda item: resume_at(*item), order))
    else:
        results = [resume_at(rep, at) for rep, at in order]
    runs = {10: [], far: []}
    for (rep, at), r in zip(order, results):
        runs[at].append(r)
        print(f"  (e) rep {rep} tfdist.fit resuming at step {at}: first step done after {r['to_first_step']:.2f} s "
              f"(process {r['process_seconds']:.1f} s)", flush=True)
    return {"examples": steps * batch, "batch": batch, "far": far, "runs": {str(k): v for k, v in runs.items()}}


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--dir", default=None, help="directory for checkpoints (default: a temporary one under /tmp)")
    p.add_argument("--every", type=int, default=None, help="(b) save every N steps (default 100; --quick 20)")
    p.add_argument("--parts", default="abcde", help="which parts to run (default abcde; c runs with a)")
    _common.add_reps_option(p, default=3, flag="--b-reps", what="(b) lockstep repetitions")
    p.add_argument("--b-warmup", type=int, default=2,
                   help="(b) stretches with a save left untimed first: one-time costs of a process's first async saves")
    args = p.parse_args()
    if args.child:
        import json

        e2e_child(json.loads(args.child))
        return
    _common.quiet_tensorflow()
    quick = args.quick
    base = args.dir or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="tfdist-bench-", dir=base)
    info = _common.machine(paths=[workdir, _common.REPO])
    print("machine:", _common.describe_machine(info), flush=True)
    print("filesystems:", info["filesystems"], flush=True)
    results, rows, notes = {"workdir": workdir}, [], []
    try:
        if "a" in args.parts or "c" in args.parts:
            # Quick mode uses "cnn" (a few hundred kB): it only checks the code runs.
            a = saves(workdir, reps=1 if quick else 5, model_name="cnn" if quick else "wide")
            results["a_c"] = a
            blocked = {m: _common.summary_of(a["runs"][m], "blocked") for m in ("sync", "async")}
            complete = {m: _common.summary_of(a["runs"][m], "complete") for m in ("sync", "async", "raw")}
            durable = {m: _common.summary_of(a["runs"][m], "durable") for m in ("sync", "async", "raw")}
            ratio = _common.summary([x["blocked"] / s["complete"] for s, x in zip(a["runs"]["sync"], a["runs"]["async"])])
            size = a["checkpoint_bytes"]
            results["a"] = {"blocked": blocked, "complete": complete, "durable": durable, "async_over_sync": ratio}
            what = f"\"{a['model']}\" + Adam, {a['params'] / 1e6:.1f} M params, {size / 1e6:.0f} MB on disk"
            rows.append((f"(a) {what}: blocked per save, async / sync",
                         f"**{_common.fmt_ratio(ratio)}**; async save() returns in {_common.fmt(blocked['async'], 1e3, ' ms')}, "
                         f"sync save {_common.fmt(blocked['sync'], 1, ' s')}; async complete (until sync()) "
                         f"{_common.fmt(complete['async'], 1, ' s')}",
                         f"≤ {TARGET_ASYNC_BLOCK}", _common.verdict(ratio["median"], TARGET_ASYNC_BLOCK)))
            bw = {}
            for kind in ("complete", "durable"):
                for mode in ("sync", "async"):
                    bw[kind, mode] = _common.summary([
                        (s["bytes"] / s[kind]) / (r["bytes"] / r[kind]) for s, r in zip(a["runs"][mode], a["runs"]["raw"])])
            for mode in ("sync", "async"):
                bw["written", mode] = _common.summary([
                    (s["bytes"] / s["written_durable"]) / (r["bytes"] / r["durable"])
                    for s, r in zip(a["runs"][mode], a["runs"]["raw"])])
            results["c"] = {f"{k}_{m}": v for (k, m), v in bw.items()}
            disk = {k: _common.summary([r["bytes"] / r[k] for r in a["runs"]["raw"]]) for k in ("complete", "durable")}
            ckbw = {k: _common.summary([r["bytes"] / r[k] for r in a["runs"]["sync"]]) for k in ("complete", "durable")}
            results["c"]["disk_bytes_per_second"] = disk
            results["c"]["sync_save_bytes_per_second"] = ckbw
            plain = {k: _common.summary([r["bytes"] / r[k] for r in a["runs"]["write"]]) for k in ("complete", "durable")}
            plain_ratio = _common.summary([(w["bytes"] / w["durable"]) / (r["bytes"] / r["durable"])
                                           for w, r in zip(a["runs"]["write"], a["runs"]["raw"])])
            delete = _common.summary_of(a["runs"]["raw"], "delete")
            results["c"]["plain_write_bytes_per_second"] = plain
            results["c"]["plain_write_over_disk_durable"] = plain_ratio
            results["c"]["delete_seconds"] = delete
            written = {m: _common.summary_of(a["runs"][m], "written") for m in ("sync", "async")}
            results["c"]["written_seconds"] = written
            rows.append(("(c) save bandwidth / disk write bandwidth, durable: checkpoint written (files complete, "
                         "before the oldest checkpoint is deleted) + fsync / os.write + fsync, async save (the default)",
                         f"**{_common.fmt_ratio(bw['written', 'async'])}**; sync save: {_common.fmt_ratio(bw['written', 'sync'])}; "
                         f"written in {_common.fmt(written['async'], 1, ' s')} (async), {_common.fmt(written['sync'], 1, ' s')} (sync)",
                         f"≥ {TARGET_BANDWIDTH}", _common.verdict(bw["written", "async"]["median"], TARGET_BANDWIDTH, below=False)))
            rows.append(("(c) save bandwidth / disk write bandwidth, durable (fsync on both sides), whole sync save "
                         "(the oldest checkpoint's deletion included)",
                         f"**{_common.fmt_ratio(bw['durable', 'sync'])}**; save + fsync {_common.fmt(ckbw['durable'], 1e-6, ' MB/s')}, "
                         f"os.write + fsync {_common.fmt(disk['durable'], 1e-6, ' MB/s')}",
                         f"(≥ {TARGET_BANDWIDTH})", _common.verdict(bw["durable", "sync"]["median"], TARGET_BANDWIDTH, below=False)))
            rows.append(("(c) same, async save (complete = until sync(), then fsync)",
                         _common.fmt_ratio(bw["durable", "async"]),
                         f"(≥ {TARGET_BANDWIDTH})", _common.verdict(bw["durable", "async"]["median"], TARGET_BANDWIDTH, below=False)))
            rows.append(("(c) save bandwidth / write bandwidth, page cache (no fsync either side), sync save",
                         f"{_common.fmt_ratio(bw['complete', 'sync'])}; save {_common.fmt(ckbw['complete'], 1e-6, ' MB/s')}, "
                         f"os.write {_common.fmt(disk['complete'], 1e-6, ' MB/s')}; async: {_common.fmt_ratio(bw['complete', 'async'])}",
                         f"(≥ {TARGET_BANDWIDTH})", _common.verdict(bw["complete", "sync"]["median"], TARGET_BANDWIDTH, below=False)))
            rows.append(("(c) breakdown: `tf.train.Checkpoint.write` alone (no manager, no old checkpoint deleted) "
                         "+ fsync / os.write + fsync",
                         f"{_common.fmt_ratio(plain_ratio)}; write alone {_common.fmt(plain['complete'], 1e-6, ' MB/s')} "
                         f"(page cache); deleting a file of the checkpoint's size {_common.fmt(delete, 1, ' s')}",
                         "–", "–"))
            notes.append(f"(a)/(c): {len(a['runs']['sync'])} repetitions of sync save, async save, raw write and "
                         "plain Checkpoint.write, "
                         "alternated, after three discarded warm-up saves of each kind (TensorFlow's first async saves "
                         "trace and allocate); keep=2, so every timed sync save also deletes the oldest checkpoint (an "
                         "async save does it in the background); the "
                         "checkpoint files are fsynced "
                         "after each save (outside the blocked/complete times) so dirty pages do not carry over. "
                         f"Directory {workdir} on {info['filesystems'][workdir]}.")
        if "b" in args.parts:
            every = args.every or (20 if quick else 100)
            spec = dict(turns=2 if quick else 4, warmup=args.b_warmup, every=every, batch=32, features=256, width=1024,
                        depth=2 if quick else 3, dir=workdir)
            reps = args.b_reps or (1 if quick else 3)
            runs = {"none": [], "save": []}
            for rep in range(reps):
                specs = {v: dict(spec, variant=v) for v in runs}
                for variant, r in _common.lockstep(throughput_child, specs, rotation=rep, linger=5).items():
                    runs[variant].append(r)
                    print(f"  (b) rep {rep} {variant:4s}: {r['steps_per_second']:.1f} steps/s, turns "
                          f"{' '.join(f'{t:.2f}' for t in r['turn_seconds'])} s, waits for writes "
                          f"{sum(r['write_wait_seconds']):.3f} s", flush=True)
            loss = _common.summary([1 - s["steps_per_second"] / n["steps_per_second"] for n, s in zip(runs["none"], runs["save"])])
            sps = {v: _common.summary_of(runs[v], "steps_per_second") for v in runs}
            waits = _common.summary([w for r in runs["save"] for w in r["write_wait_seconds"]])
            # Extra training time per save: (time of a stretch with a save - without) per repetition.
            per_save = _common.summary([(sum(s["turn_seconds"]) - sum(n["turn_seconds"])) / len(s["turn_seconds"])
                                        for n, s in zip(runs["none"], runs["save"])])
            warm = _common.summary([(sum(s["warmup_turn_seconds"]) - sum(n["warmup_turn_seconds"])) / len(s["warmup_turn_seconds"])
                                    for n, s in zip(runs["none"], runs["save"]) if s["warmup_turn_seconds"]])
            ck_bytes = runs["save"][0]["checkpoint_bytes"]
            params = runs["save"][0]["params"]
            step_ms = 1e3 / sps["none"]["median"]
            results["b"] = {"spec": spec, "runs": runs, "loss": loss, "steps_per_second": sps,
                            "write_waits": waits, "extra_seconds_per_save": per_save,
                            "extra_seconds_per_warmup_save": warm}
            rows.append((f"(b) throughput loss, save every {every} steps (~{every * step_ms / 1e3:.1f} s of training) "
                         f"vs none; MLP {spec['features']}-{'-'.join([str(spec['width'])] * spec['depth'])}-10 "
                         f"({params / 1e6:.1f} M params, {ck_bytes / 1e6:.0f} MB checkpoint), batch {spec['batch']}, "
                         f"{spec['turns']} timed stretches of {every} steps with one save each, after "
                         f"{spec['warmup']} untimed ones",
                         f"**{_common.fmt(loss, 100, ' %')}**; {_common.fmt(sps['none'], 1, ' steps/s')} without, "
                         f"{_common.fmt(sps['save'], 1, ' steps/s')} with saves; extra time per save "
                         f"{_common.fmt(per_save, 1e3, ' ms')} (each of the first {spec['warmup']} saves of the process, "
                         f"untimed: {_common.fmt(warm, 1e3, ' ms')}); write still running at the end of a "
                         f"stretch: waited {_common.fmt(waits, 1e3, ' ms')}",
                         f"≤ {TARGET_THROUGHPUT_LOSS * 100:g} %", _common.verdict(loss["median"], TARGET_THROUGHPUT_LOSS)))
            notes.append(f"(b): {reps} repetitions; in each, the two variants run in fresh processes in lockstep, "
                         f"passing the turn at steps kN + N/2 (N = {every}), so each timed stretch of N steps holds one "
                         "save in its middle; the saving process waits for its background write before passing the "
                         "turn (counted against it). The first stretch (setup, tracing), the next "
                         f"{spec['warmup']} (the process's first saves, which pay one-time costs of TensorFlow's async "
                         "checkpointing; their extra time is reported apart) and the last (epoch-end save) are not "
                         "timed, nor what fit does after its last epoch.")
        if "d" in args.parts:
            far = 10_000 if quick else 100_000
            d = resume(reps=2 if quick else 5, naive_reps=1 if quick else 2, far=far, near=10, batch=32)
            results["d"] = d
            r = {k: _common.summary(v) for k, v in d["runs"].items()}
            ratio = _common.summary([b / a for a, b in zip(d["runs"]["start 10"], d["runs"][f"start {far}"])])
            naive = _common.summary([b / a for a, b in zip(d["runs"]["skip 10"], d["runs"][f"skip {far}"])])
            results["d"]["summary"] = r
            results["d"]["ratio"] = ratio
            rows.append((f"(d) data-path resume latency, step {far:,} / step 10 (one epoch of {d['steps_per_epoch']:,} "
                         f"steps, {d['examples'] / 1e6:.1f} M examples, batch {d['batch']})",
                         f"**{_common.fmt_ratio(ratio)}**; {_common.fmt(r['start 10'], 1e3, ' ms')} vs "
                         f"{_common.fmt(r[f'start {far}'], 1e3, ' ms')}",
                         f"≤ {TARGET_RESUME}", _common.verdict(ratio["median"], TARGET_RESUME)))
            rows.append((f"(d) for context: naive `skip(S)` of the pipeline started at 0, step {far:,} / step 10",
                         f"{_common.fmt_ratio(naive)}; {_common.fmt(r['skip 10'], 1e3, ' ms')} vs "
                         f"{_common.fmt(r[f'skip {far}'], 1, ' s')}", "–", "–"))
            notes.append("(d): dataset_fn + iter + first batch, in one process after one discarded warm-up call; "
                         "the first batch is checked against the epoch's permutation.")
        if "e" in args.parts:
            far = 10_000 if quick else 100_000
            e = e2e(workdir, reps=1 if quick else 3, far=far, batch=32, quick=quick)
            results["e"] = e
            first = {k: _common.summary_of(v, "to_first_step") for k, v in e["runs"].items()}
            ratio = _common.paired(e["runs"]["10"], e["runs"][str(far)], "to_first_step")
            results["e"]["summary"] = first
            results["e"]["ratio"] = ratio
            rows.append((f"(e) end-to-end `tfdist.fit` resume latency (call -> first step done), checkpoint at step "
                         f"{far:,} / step 10 (\"linear\" model, {e['examples'] / 1e6:.1f} M examples, batch {e['batch']})",
                         f"{_common.fmt_ratio(ratio)}; {_common.fmt(first['10'], 1, ' s')} vs "
                         f"{_common.fmt(first[str(far)], 1, ' s')}", f"(≤ {TARGET_RESUME})",
                         _common.verdict(ratio["median"], TARGET_RESUME)))
            notes.append("(e): ckpt-10 comes from a real run stopped after 10 steps; the step-100,000 checkpoint is "
                         "the same state re-saved by tfdist's Checkpointer with the progress counters at 100,000 "
                         "(training 100,000 steps would take too long); each timed resume runs in a fresh process "
                         "on a copy of the directory, alternated; the time excludes importing TensorFlow.")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    flags = ["--quick"] if quick else []
    if args.every:
        flags.append(f"--every {args.every}")
    if args.parts != "abcde":
        flags.append(f"--parts {args.parts}")
    if args.b_reps:
        flags.append(f"--b-reps {args.b_reps}")
    if args.b_warmup != 2:
        flags.append(f"--b-warmup {args.b_warmup}")
    _common.finish(
        title="checkpoint: async blocking, throughput with saves, bandwidth, resume latency",
        info=info,
        command=" ".join(["python benchmarks/checkpoint.py", *flags]),
        results=results,
        rows=rows,
        notes=notes,
        args=args,
    )


if __name__ == "__main__":
    main()
