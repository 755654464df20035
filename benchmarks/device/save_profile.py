"""How long each of a run's first asynchronous saves blocks with the state in GPU memory, and where
the time of a later one goes (cProfile): the "wide" model + Adam (~594 MB), tfdist's Checkpointer.

    python benchmarks/device/save_profile.py [--saves 4] [--device /gpu:0]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--saves", type=int, default=4, help="saves timed; the last one is profiled")
    p.add_argument("--device", default="/gpu:0")
    args = p.parse_args()
    import tensorflow as tf

    from tfdist import checkpoint as ckpt_mod
    from tfdist import models
    from tfdist.data import load_digits
    from tfdist.training import model as keras_model

    train, _ = load_digits()
    strategy = tf.distribute.OneDeviceStrategy(args.device)
    builder = models.builder("wide", input_shape=train.example_shape, num_classes=10, keras="2")
    adapter, model = keras_model.resolve(builder, strategy)
    adapter.prepare(model, sample=train.sample(32), grad_accum_steps=1)
    model.train_on_batch(*train.sample(32))
    checkpointer = ckpt_mod.Checkpointer(
        options=ckpt_mod.CheckpointOptions(directory=tempfile.mkdtemp(prefix="tfdist-save-profile-"), keep=2),
        state=adapter.state(model), strategy=strategy, is_chief=True, task_name="chief:0",
        run_metadata=ckpt_mod.RunMetadata(global_batch_size=32, data_fingerprint="digits", model_fingerprint="wide",
                                          seed=0))
    print(f"state on {model.weights[0].device}: {len(model.weights)} model + "
          f"{len(model.optimizer.variables())} optimizer variables")
    profile = cProfile.Profile()
    for step in range(1, args.saves + 1):
        last = step == args.saves
        if last:
            profile.enable()
        start = time.perf_counter()
        checkpointer.save(global_step=step, epoch=0, step_in_epoch=step, history=[])
        blocked = time.perf_counter() - start
        if last:
            profile.disable()
        checkpointer.sync()
        print(f"save {step}: blocked {blocked * 1e3:.0f} ms, complete {time.perf_counter() - start:.3f} s", flush=True)
    checkpointer.close()
    pstats.Stats(profile).sort_stats("cumulative").print_stats(20)


if __name__ == "__main__":
    main()
