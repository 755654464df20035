"""Images in class folders: tfdist's ImageFolderSource against Keras' image_dataset_from_directory.

``--images`` JPEG files (``--size`` pixels square, 10 classes, smooth random pictures) are
written once under ``--data-dir`` and reused; the page cache holds them, so "read" means read
from memory. Every measurement runs in a fresh process; variants alternate (A B, B A, ...):

* (a) input images/s: tfdist's pipeline for one replica (``dataset_fn``: the seeded global
  order, each batch's files read and decoded by TensorFlow ops) against Keras 3's
  ``image_dataset_from_directory(shuffle=True, seed=0)`` followed by ``prefetch``; the same
  decoding and resizing (the tests check the pixels are equal), batches of 64, no training.
  Target >= 0.9x.
* (b) resume latency: from ``dataset_fn(start_step=S)`` to its first batch, at the last step of
  an epoch against step 10. Target <= 1.5x: the file of any position is computed, not reached
  by reading the ones before it (Keras' dataset can only be skipped through).

    python benchmarks/image_folder.py [--quick] [--images 20000] [--size 96] [--data-dir /tmp/tfdist-images]
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

BATCH = 64
CLASSES = 10
TARGETS = {"a": 0.9, "b": 1.5}


def generate(directory: str, count: int, size: int) -> dict:
    """Writes (once) ``count`` JPEG files of ``size`` x ``size`` pixels in ``CLASSES`` folders; returns the manifest."""
    manifest_path = os.path.join(directory, "manifest.json")
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
        if manifest["images"] == count and manifest["size"] == size:
            return manifest
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    total = 0
    for i in range(count):
        folder = os.path.join(directory, f"class{i % CLASSES}")
        os.makedirs(folder, exist_ok=True)
        coarse = rng.integers(0, 256, (size // 8, size // 8, 3)).astype(np.float32)
        image = tf.cast(tf.image.resize(coarse[None], (size, size))[0], tf.uint8)
        data = tf.io.encode_jpeg(image, quality=90).numpy()
        with open(os.path.join(folder, f"{i:06d}.jpg"), "wb") as f:
            f.write(data)
        total += len(data)
    manifest = {"images": count, "size": size, "bytes": total}
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)
    return manifest


def _source_and_plan(spec: dict):
    from tfdist import data

    source = data.ImageFolderSource(spec["dir"], image_size=(spec["size"], spec["size"]))
    sizes = data.BatchSizes.resolve(num_replicas=1, batch_size=BATCH)
    return source, data.make_plan(source, sizes, steps_per_epoch=None, epochs=1, seed=0)


def child(spec: dict) -> None:
    _common.quiet_tensorflow()
    import tensorflow as tf

    from tfdist import data

    if spec["part"] == "a":
        if spec["variant"] == "tfdist":
            source, plan = _source_and_plan(spec)
            ds = data.dataset_fn(source, plan, start_step=0, stop_step=plan.total_steps)(None)
        else:
            import keras

            ds = keras.utils.image_dataset_from_directory(spec["dir"], image_size=(spec["size"], spec["size"]),
                                                          batch_size=BATCH, shuffle=True, seed=0,
                                                          verbose=False).prefetch(tf.data.AUTOTUNE)
        seconds = _common.time_batches(ds, warmup=spec["warmup"], batches=spec["batches"])
        _common.emit({"images_per_sec": spec["batches"] * BATCH / seconds, "seconds": seconds})
    else:
        t0 = time.perf_counter()
        source, plan = _source_and_plan(spec)
        start_step = plan.steps_per_epoch - 1 if spec["where"] == "last" else 10
        ds = data.dataset_fn(source, plan, start_step=start_step, stop_step=plan.total_steps)(None)
        next(iter(ds))
        _common.emit({"seconds": time.perf_counter() - t0, "start_step": start_step,
                      "steps_per_epoch": plan.steps_per_epoch})


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=20_000, help="how many images (default 20,000)")
    p.add_argument("--size", type=int, default=96, help="their width and height in pixels (default 96)")
    p.add_argument("--data-dir", default="/tmp/tfdist-images", help="where they are written once and reused")
    _common.add_reps_option(p, default=3)
    args = p.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    quick = args.quick
    count = 2_000 if quick else args.images
    directory = args.data_dir + ("-quick" if quick else "")
    reps = args.reps or (1 if quick else 3)
    t0 = time.perf_counter()
    manifest = generate(directory, count, args.size)
    print(f"data: {manifest['images']:,} JPEG files of {args.size}x{args.size}, {manifest['bytes'] / 1e6:.0f} MB "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    info = _common.machine(paths=[directory])
    base = {"dir": directory, "size": args.size}
    batches = min(count // BATCH - 8, 20 if quick else 200)
    runs: dict[str, list] = {"tfdist": [], "keras": []}
    for _, variant in _common.alternate(tuple(runs), reps):
        result = _common.run_child(__file__, {**base, "part": "a", "variant": variant, "warmup": 5, "batches": batches})
        runs[variant].append(result)
        print(json.dumps({"part": "a", "variant": variant, **result}), flush=True)
    ratio = _common.paired(runs["keras"], runs["tfdist"], "images_per_sec")
    rows = [("(a) input images/s, tfdist ImageFolderSource / Keras image_dataset_from_directory (one replica)",
             f"{_common.fmt_ratio(ratio)}; {_common.fmt(_common.summary_of(runs['tfdist'], 'images_per_sec'))} vs "
             f"{_common.fmt(_common.summary_of(runs['keras'], 'images_per_sec'))} images/s",
             f">= {TARGETS['a']}", _common.verdict(ratio["median"], TARGETS["a"], below=False))]
    resume: dict[str, list] = {"10": [], "last": []}
    for _, where in _common.alternate(tuple(resume), reps + (0 if quick else 2)):
        result = _common.run_child(__file__, {**base, "part": "b", "where": where})
        resume[where].append(result)
        print(json.dumps({"part": "b", "where": where, **result}), flush=True)
    latency = _common.paired(resume["10"], resume["last"], "seconds")
    last = resume["last"][0]["start_step"]
    rows.append((f"(b) resume latency, step {last:,} (last of the epoch) / step 10",
                 f"{_common.fmt_ratio(latency)}; {_common.fmt(_common.summary_of(resume['last'], 'seconds'), unit=' s')} "
                 f"vs {_common.fmt(_common.summary_of(resume['10'], 'seconds'), unit=' s')}",
                 f"<= {TARGETS['b']}", _common.verdict(latency["median"], TARGETS["b"])))
    _common.finish(
        title="Images in class folders: ImageFolderSource against image_dataset_from_directory",
        info=info, command=" ".join(["python", "benchmarks/image_folder.py", *sys.argv[1:]]),
        results={"a": runs, "b": resume, "data": manifest}, rows=rows, args=args,
        notes=[f"Data: {manifest['images']:,} JPEG files of {args.size}x{args.size} in {CLASSES} class folders, "
               f"{manifest['bytes'] / 1e6:.0f} MB; batches of {BATCH}, decoded to float32 and resized to "
               f"{args.size}x{args.size} (bilinear) by both."],
    )


if __name__ == "__main__":
    main()
