"""A user's training script for the engine tests (docs/launch.md: "your own script the same way").

Run as ``python _train.py CHECKPOINT_DIR``; every task of a cluster runs it. Each step lasts
``STEP_SECONDS`` at least, so that a signal or a cut link can land in the middle of training.
tfdist is imported first, as docs/multi-host.md says: from then on a preemption signal exits 75.
The tasks that train print ``RESULT {json}``: their rank, strategy and steps. With ``TASK_LOG``
set (a path with ``{rank}`` in it), each task also writes tfdist's log lines to its own file, which
no cancelled ``srun`` can cut short.
"""

import tfdist  # noqa: I001 -- first: Keras' import takes seconds in which a signal would kill the task

import json
import logging
import os
import sys
import time

import keras

from tfdist.models import builder

EPOCHS, STEPS_PER_EPOCH = 2, 40


class Slow(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(float(os.environ.get("STEP_SECONDS", "0")))


def _rank() -> int:
    return int(os.environ.get("SLURM_PROCID") or json.loads(os.environ.get("TF_CONFIG", "{}"))["task"]["index"])


def main(checkpoint_dir: str) -> None:
    if os.environ.get("TASK_LOG"):
        logging.getLogger("tfdist").addHandler(logging.FileHandler(os.environ["TASK_LOG"].format(rank=_rank())))
    history = tfdist.fit(builder("linear", input_shape=(8, 8, 1), num_classes=10), "digits", epochs=EPOCHS,
                         steps_per_epoch=STEPS_PER_EPOCH, batch_size=32, seed=1, checkpoint_dir=checkpoint_dir,
                         save_every_steps=10, callbacks=[Slow()], verbose=0)
    if history is not None:  # None on the tasks that serve parameter servers
        s = history.tfdist
        print("RESULT", json.dumps({"rank": _rank(), "strategy": s.strategy, "num_workers": s.num_workers,
                                    "start_step": s.start_step, "global_step": s.global_step}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
