"""Training: ``fit`` as named phases (``run``), the controller around every step (``controller``),
the tf_keras callback that reports to it (``callback``), the user's callbacks' state in
checkpoints (``callback_state``), the model side (``model``), preemption,
fault injection, the summary, ``evaluate`` and ``predict`` (a trained model under its strategy), and the sidecar evaluator."""

from tfdist.training.evaluation import evaluate, predict
from tfdist.training.run import fit
from tfdist.training.summary import FitSummary

__all__ = ["evaluate", "fit", "FitSummary", "predict"]
