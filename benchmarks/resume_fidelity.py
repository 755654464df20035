"""Does a run killed mid-epoch and started again end as one never interrupted? tfdist against
Keras' own ``BackupAndRestore`` (Keras 3 and tf_keras), side by side in one run.

Every tool trains the same model (tfdist's built-in residual CNN: input noise, BatchNormalization,
Dropout; SGD with momentum) on the bundled digits, with the same seed and op determinism, in three fresh processes: a run
never interrupted, a run SIGKILLed after global batch ``--kill-at`` (mid-epoch), and the same
command again, which resumes. Both save every 5 steps. Four scenarios:

* ``plain``: no callbacks besides the saving one;
* ``callbacks``: ``ReduceLROnPlateau`` and ``EarlyStopping(restore_best_weights=True)``,
  whose patience counters live in Python;
* ``pydataset``: as ``plain``, but the data is a Keras ``PyDataset`` (tf_keras: ``Sequence``) of
  batches of 128 over the same arrays, the form of file-reading data most Keras users write;
* ``images``: as ``plain``, but the data is the same digits as PNG files in one folder per
  class: ``tfdist.ImageFolderSource`` against Keras' ``image_dataset_from_directory``
  (shuffled, seed 0), the model rescaling the 0-255 pixels first;
* ``ctrl-c``: as ``plain``, but the run is stopped by Ctrl-C (SIGINT, a terminal's or a
  notebook's interrupt) instead of SIGKILL, and each tool saves as it does by default: at
  epoch ends (tfdist's default; ``BackupAndRestore(save_freq="epoch")``, Keras' default).

Reported per tool and scenario: whether the final weights are bit-identical to the run never
interrupted (and the largest difference), the epochs each ran, the final learning rate, and
the batches trained in all (a tool that restarts the epoch trains some twice).

    python benchmarks/resume_fidelity.py                       # ~5 min
    python benchmarks/resume_fidelity.py --scenarios ctrl-c    # one scenario (~2 min)
    python benchmarks/resume_fidelity.py --quick               # tfdist, plain scenario only (< 60 s)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile

import _common

TOOLS = {
    "tfdist (Keras 3)": ("tfdist", "keras"),
    "tfdist (tf_keras)": ("tfdist", "tf_keras"),
    "Keras 3 BackupAndRestore": ("keras_bar", "keras"),
    "tf_keras BackupAndRestore": ("keras_bar", "tf_keras"),
}
SCENARIOS = ("plain", "callbacks", "pydataset", "images", "ctrl-c")
EPOCHS, BATCH, SAVE_EVERY = 6, 128, 5


# --- the child: one process of one run ---------------------------------------------------------
def _data():
    import numpy as np

    from tfdist.data.loading import DIGITS_FILE

    rows = np.loadtxt(DIGITS_FILE, delimiter=",")
    x = (rows[:, :-1].reshape(-1, 8, 8) / 16.0).astype("float32")[..., None]
    y = rows[:, -1].astype("int64")
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    return (x[:1440], y[:1440]), (x[1440:], y[1440:])


def _build(keras_name: str, *, pixels: bool = False):
    """tfdist's built-in residual CNN (input noise, BatchNormalization, Dropout) on SGD with
    momentum: a float learning rate, which ReduceLROnPlateau can change. ``pixels``: its input
    is 0-255 pixels, rescaled first."""
    from tfdist import models

    def make():
        version = "3" if keras_name == "keras" else "2"
        model = models.build("resnet", input_shape=(8, 8, 1), num_classes=10, keras=version)
        keras = models.keras_module(version)
        if pixels:
            model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Rescaling(1 / 255), model])
        model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return model

    return make


def _batches(keras, x, y):
    """``x``, ``y`` as a Keras PyDataset (Keras 3) or Sequence (tf_keras) of batches of ``BATCH``."""
    base = keras.utils.PyDataset if hasattr(keras.utils, "PyDataset") else keras.utils.Sequence

    class Batches(base):
        def __len__(self):
            return -(-len(x) // BATCH)

        def __getitem__(self, index):
            part = slice(index * BATCH, (index + 1) * BATCH)
            return x[part], y[part]

    return Batches()


def _write_images(folder: str) -> None:
    """The training digits as 8 x 8 grayscale PNG files, ``folder/<digit>/<n>.png``."""
    import numpy as np
    import tensorflow as tf

    (x, y), _ = _data()
    for n, (image, label) in enumerate(zip(x, y)):
        os.makedirs(os.path.join(folder, str(label)), exist_ok=True)
        tf.io.write_file(os.path.join(folder, str(label), f"{n:04d}.png"),
                         tf.io.encode_png(np.round(image * 255).astype(np.uint8)))


def _image_data(keras, spec: dict):
    """(training data, validation arrays in 0-255 pixels) of the images scenario, for the tool of ``spec``."""
    import numpy as np

    _, (x_val, y_val) = _data()
    validation = (np.round(x_val * 255).astype("float32"), y_val)
    if spec["tool"] == "tfdist":
        import tfdist

        return tfdist.ImageFolderSource(spec["images"], image_size=(8, 8), color_mode="grayscale"), validation
    quiet = {"verbose": False} if spec["keras"] == "keras" else {}  # tf_keras' has no verbose
    return keras.utils.image_dataset_from_directory(spec["images"], image_size=(8, 8), color_mode="grayscale",
                                                    batch_size=BATCH, shuffle=True, seed=0, **quiet), validation


def _signal(scenario: str) -> signal.Signals:
    """How the interrupted run of ``scenario`` is stopped."""
    return signal.SIGINT if scenario == "ctrl-c" else signal.SIGKILL


def _callbacks(keras, scenario: str, kill_at: int | None) -> tuple[list, object]:
    """(the scenario's callbacks, the batch counter); the killer comes last."""

    class Counter(keras.callbacks.Callback):
        batches = 0

        def on_train_batch_end(self, batch, logs=None):
            Counter.batches += 1
            if kill_at is not None and Counter.batches == kill_at:
                os.kill(os.getpid(), _signal(scenario))

    cbs = []
    if scenario == "callbacks":
        cbs += [keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=1, factor=0.5, min_delta=10.0),
                keras.callbacks.EarlyStopping(monitor="loss", patience=3, min_delta=10.0, restore_best_weights=True)]
    return cbs, Counter


def child(spec: dict) -> None:
    _common.quiet_tensorflow()
    import numpy as np
    import tensorflow as tf

    keras = __import__(spec["keras"])
    (x, y), validation = _data()
    data = _batches(keras, x, y) if spec["scenario"] == "pydataset" else (x, y)
    if spec["scenario"] == "images":
        data, validation = _image_data(keras, spec)
    build = _build(spec["keras"], pixels=spec["scenario"] == "images")
    cbs, counter = _callbacks(keras, spec["scenario"], spec.get("kill_at"))
    directory = spec["dir"]
    every = None if spec["scenario"] == "ctrl-c" else SAVE_EVERY  # None: each tool's default, at epoch ends
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal, even if this benchmark runs under nohup
    if spec["tool"] == "tfdist":
        import tfdist

        history = tfdist.fit(build, data, validation_data=validation, epochs=EPOCHS, batch_size=BATCH,
                             seed=0, deterministic=True, strategy="one_device", verbose=0,
                             checkpoint_dir=os.path.join(directory, "ckpt"), save_every_steps=every,
                             callbacks=[*cbs, counter()])
    else:
        keras.utils.set_random_seed(0)
        tf.config.experimental.enable_op_determinism()
        model = build()
        backup = keras.callbacks.BackupAndRestore(os.path.join(directory, "backup"), save_freq=every or "epoch")
        arrays = {"x": data} if spec["scenario"] in ("pydataset", "images") else {"x": x, "y": y, "batch_size": BATCH}
        history = model.fit(**arrays, validation_data=validation, epochs=EPOCHS, shuffle=True,
                            verbose=0, callbacks=[*cbs, backup, counter()])
    model = history.model
    np.savez(os.path.join(directory, "weights.npz"), *model.get_weights())
    _common.emit({
        "last_epoch": int(history.epoch[-1]) if history.epoch else None,
        "learning_rate": float(np.asarray(model.optimizer.learning_rate)),
        "batches": counter.batches,
    })


# --- the parent --------------------------------------------------------------------------------
def _killed(spec: dict) -> int:
    """Runs a child that SIGKILLs itself (or sends itself SIGINT, which ends it with an uncaught
    KeyboardInterrupt: Python then exits by SIGINT); returns the batches it had trained (its kill point)."""
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                          timeout=600, env=_common.child_env(), cwd=_common.REPO)
    expected = _signal(spec["scenario"])
    if proc.returncode != -expected:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise RuntimeError(f"the interrupted run {spec} ended with {proc.returncode}, not {expected.name}")
    return spec["kill_at"]


def _weights(directory: str) -> list:
    import numpy as np

    with np.load(os.path.join(directory, "weights.npz")) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


def compare(tool: str, scenario: str, kill_at: int, root: str, images: str) -> dict:
    import numpy as np

    kind, keras = TOOLS[tool]
    base = {"tool": kind, "keras": keras, "scenario": scenario, "images": images}
    ref_dir, int_dir = os.path.join(root, "reference"), os.path.join(root, "interrupted")
    os.makedirs(ref_dir), os.makedirs(int_dir)
    reference = _common.run_child(__file__, {**base, "dir": ref_dir})
    first = _killed({**base, "dir": int_dir, "kill_at": kill_at})
    resumed = _common.run_child(__file__, {**base, "dir": int_dir})
    a, b = _weights(ref_dir), _weights(int_dir)
    same_shapes = [x.shape for x in a] == [x.shape for x in b]
    diff = max(float(np.max(np.abs(x - y))) for x, y in zip(a, b)) if same_shapes else float("inf")
    return {
        "tool": tool, "scenario": scenario, "identical": same_shapes and all(np.array_equal(x, y) for x, y in zip(a, b)),
        "max_abs_diff": diff, "epochs": (reference["last_epoch"] + 1, resumed["last_epoch"] + 1),
        "learning_rate": (reference["learning_rate"], resumed["learning_rate"]),
        "batches": (reference["batches"], first + resumed["batches"]),
    }


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--kill-at", type=int, default=27, help="the global batch after which the run is killed (default 27)")
    p.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS), help="(default: all)")
    args = p.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    info = _common.machine()
    tools = ["tfdist (Keras 3)"] if args.quick else list(TOOLS)
    scenarios = ["plain"] if args.quick else args.scenarios
    results = []
    with tempfile.TemporaryDirectory(prefix="tfdist-fidelity-") as tmp:
        images = os.path.join(tmp, "images")
        if "images" in scenarios:
            _write_images(images)
        for scenario in scenarios:
            for i, tool in enumerate(tools):
                result = compare(tool, scenario, args.kill_at, os.path.join(tmp, f"{scenario}-{i}"), images)
                print(json.dumps(result), flush=True)
                results.append(result)
    rows = [
        (r["scenario"], r["tool"], "**yes**" if r["identical"] else "no", f"{r['max_abs_diff']:.3g}",
         "{} → {}".format(*r["epochs"]), "{:.4g} → {:.4g}".format(*r["learning_rate"]), "{} → {}".format(*r["batches"]))
        for r in results
    ]
    _common.finish(
        title="Resume fidelity: killed mid-epoch and started again, against a run never interrupted",
        info=info, command=" ".join(["python", "benchmarks/resume_fidelity.py", *sys.argv[1:]]), results={"runs": results},
        rows=rows, args=args,
        header=("Scenario", "Tool", "Final weights bit-identical", "Largest weight difference", "Epochs run (never interrupted → resumed)",
                "Final learning rate", "Batches trained (never interrupted → both processes)"),
        notes=[f"SIGKILL after global batch {args.kill_at}; saves every {SAVE_EVERY} steps; {EPOCHS} epochs of "
               f"batch {BATCH} on 1440 digits (tfdist drops the last partial batch: 11 steps an epoch, Keras 12).",
               "images: the training digits as PNG files in class folders (tfdist.ImageFolderSource; Keras' "
               "image_dataset_from_directory, shuffled with seed 0), validation on the same arrays in 0-255 pixels.",
               f"ctrl-c: SIGINT after global batch {args.kill_at}; saves at epoch ends only (each tool's default)."],
    )


if __name__ == "__main__":
    main()
