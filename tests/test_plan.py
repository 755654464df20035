"""Tests of the planner: batch arithmetic, memory, checkpoints, time, the CLI and its plot."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tfdist.cli import main
from tfdist.errors import PlanError
from tfdist.planning.planner import (
    CHECKPOINT_OVERHEAD_BYTES,
    Plan,
    plan,
    ring_allreduce_seconds,
    young_daly_interval,
)
from tfdist.data.batching import solve_grad_accum_steps
from tfdist.planning.units import parse_bytes, parse_count, parse_duration



# --- the worked example -----------------------------------------------------------------
def test_worked_example_global_batch_10_gives_100_steps():
    p = plan(samples=1000, micro_batch_size=10)
    assert (p.global_batch_size, p.steps_per_epoch, p.total_steps) == (10, 100, 100)
    assert p.dropped_samples_per_epoch == 0


def test_two_accumulation_steps_halve_the_micro_batch_not_the_steps():
    p = plan(samples=1000, global_batch_size=10, grad_accum_steps=2)
    assert (p.micro_batch_size, p.grad_accum_steps, p.steps_per_epoch) == (5, 2, 100)
    assert p == plan(samples=1000, micro_batch_size=5, grad_accum_steps=2)


def test_global_batch_counts_nodes_gpus_and_accumulation():
    p = plan(samples=10_000, epochs=3, micro_batch_size=8, nodes=2, gpus_per_node=4, grad_accum_steps=3)
    assert p.replicas == 8 and p.global_batch_size == 192
    assert p.steps_per_epoch == 10_000 // 192 == 52
    assert p.total_steps == 156
    assert p.dropped_samples_per_epoch == 10_000 - 52 * 192
    assert p.to_dict()["dropped_samples"] == 3 * p.dropped_samples_per_epoch


def test_micro_batch_from_global_batch_and_replicas():
    p = plan(samples=1000, global_batch_size=64, micro_batch_size=8, nodes=2, gpus_per_node=2)
    assert p.grad_accum_steps == 2


def test_solves_the_fewest_accumulation_steps():
    p = plan(samples=100_000, global_batch_size=96, max_micro_batch_size=10, nodes=2, gpus_per_node=4)
    # k=1: 96/8 = 12 > 10; k=2: 96/16 = 6 <= 10.
    assert (p.grad_accum_steps, p.micro_batch_size) == (2, 6)
    assert solve_grad_accum_steps(global_batch_size=1024, replicas=8, max_micro_batch_size=128) == 1
    assert solve_grad_accum_steps(global_batch_size=1024, replicas=8, max_micro_batch_size=100) == 2
    # 90 over 2 replicas: k must divide 45; k=3 gives 15 > 10, k=5 gives 9.
    assert solve_grad_accum_steps(global_batch_size=90, replicas=2, max_micro_batch_size=10) == 5


def test_solving_is_impossible_when_replicas_do_not_divide():
    with pytest.raises(PlanError, match=r"global_batch_size=100.*multiple of 8, e\.g\. 96, 104"):
        plan(samples=1000, global_batch_size=100, max_micro_batch_size=4, nodes=2, gpus_per_node=4)


# --- invalid inputs ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(samples=0, micro_batch_size=1), "samples"),
        (dict(samples=-5, micro_batch_size=1), "samples"),
        (dict(samples=100, micro_batch_size=0), "micro_batch_size"),
        (dict(samples=100, micro_batch_size=-2), "micro_batch_size"),
        (dict(samples=100, micro_batch_size=2.5), "micro_batch_size"),
        (dict(samples=100, micro_batch_size=True), "micro_batch_size"),
        (dict(samples=100, micro_batch_size=1, epochs=0), "epochs"),
        (dict(samples=100, micro_batch_size=1, nodes=0), "nodes"),
        (dict(samples=100, micro_batch_size=1, gpus_per_node=-1), "gpus_per_node"),
        (dict(samples=100, micro_batch_size=1, grad_accum_steps=0), "grad_accum_steps"),
        (dict(samples=100, global_batch_size=0), "global_batch_size"),
        (dict(samples=100, global_batch_size=10, max_micro_batch_size=0), "max_micro_batch_size"),
        (dict(samples=100, global_batch_size=10, micro_batch_size=3), "global_batch_size"),  # 3 does not divide 10
        (dict(samples=100, global_batch_size=10, grad_accum_steps=4), "global_batch_size"),
        (dict(samples=100, global_batch_size=10, micro_batch_size=2, grad_accum_steps=2), "global_batch_size"),
        (dict(samples=100, global_batch_size=9, gpus_per_node=2), "global_batch_size"),
        (dict(samples=100, micro_batch_size=20, max_micro_batch_size=16), "micro_batch_size"),
        (dict(samples=100, micro_batch_size=101), "global_batch_size"),  # not one step per epoch
        (dict(samples=100), "micro_batch_size"),
        (dict(samples=100, micro_batch_size=1, params=0), "params"),
        (dict(samples=100, micro_batch_size=1, params=10, model="x"), "params"),
        (dict(samples=100, micro_batch_size=1, optimizer_slots=-1), "optimizer_slots"),
        (dict(samples=100, micro_batch_size=1, precision="float16"), "precision"),
        (dict(samples=100, micro_batch_size=1, step_time=0), "step_time"),
        (dict(samples=100, micro_batch_size=1, step_time="fast"), "step_time"),
        (dict(samples=100, micro_batch_size=1, step_time=1.0, measure=True), "step_time"),
        (dict(samples=100, micro_batch_size=1, measure=True), "model"),
        (dict(samples=100, micro_batch_size=1, stall_window=0), "stall_window"),
        (dict(samples=100, micro_batch_size=1, mtbf=-1), "mtbf"),
        (dict(samples=100, micro_batch_size=1, write_bandwidth=0), "write_bandwidth"),
        (dict(samples=100, micro_batch_size=1, link_bandwidth="fast"), "link_bandwidth"),
        (dict(samples=100, micro_batch_size=1, activation_bytes=-1), "activation_bytes"),
        (dict(samples=100, micro_batch_size=1, keras="4"), "keras"),
        (dict(samples=100, micro_batch_size=1, keras=3), "keras"),  # a string, as tfdist.models takes it
    ],
)
def test_invalid_inputs_name_the_argument(kwargs, name):
    with pytest.raises(PlanError) as info:
        plan(**kwargs)
    message = str(info.value)
    assert f"`{name}" in message and "Fix:" in message
    assert "received" in message


def test_plan_validates_itself_when_built_directly():
    with pytest.raises(PlanError, match=r"Invalid `grad_accum_steps`; received grad_accum_steps=0\. Fix"):
        Plan(samples=10, micro_batch_size=1, grad_accum_steps=0)


def test_bad_keras_is_one_line_naming_the_value_and_the_fix():
    from tfdist.planning.measure import builtin_params, measure_step_time

    for call in (
        lambda: plan(samples=100, micro_batch_size=1, model="linear", keras="keras3"),
        lambda: measure_step_time(model="linear", micro_batch_size=4, keras="keras3"),
        lambda: builtin_params("linear", keras="keras3"),
    ):
        with pytest.raises(PlanError) as info:
            call()  # refused before TensorFlow is asked anything
        message = str(info.value)
        assert "\n" not in message and "keras='keras3'" in message and 'Fix: use "3"' in message and '"2"' in message


def test_cli_refuses_an_unknown_keras(capsys):
    with pytest.raises(SystemExit) as info:
        main(["plan", "--samples", "100", "--micro-batch", "4", "--keras", "4"])
    assert info.value.code == 2 and "--keras: invalid choice: '4'" in capsys.readouterr().err


def test_unknown_model_name_is_a_plan_error():
    with pytest.raises(PlanError, match="model='no-such-model'"):
        plan(samples=100, micro_batch_size=1, model="no-such-model")


# --- units ---------------------------------------------------------------------------------
def test_human_units():
    assert parse_bytes("500MB", name="x") == 500e6
    assert parse_bytes("1.5GiB", name="x") == 1.5 * 2**30
    assert parse_bytes("10GB/s", name="x", per_second=True) == 10e9
    assert parse_bytes("100Gbit/s", name="x", per_second=True) == 12.5e9
    assert parse_bytes("2e9", name="x") == 2e9
    assert parse_duration("30s") == 30 and parse_duration("5m") == 300 and parse_duration("24h") == 86400
    assert parse_duration("1h30m") == 5400 and parse_duration("250ms") == 0.25 and parse_duration("2") == 2
    assert parse_count("60k") == 60_000 and parse_count("1.2M") == 1_200_000 and parse_count("7B") == 7 * 10**9
    assert parse_count("1_000") == 1000 and parse_count("1e6") == 10**6
    assert parse_count("1e18") == 10**18 and parse_count("1.000000000000000001e18") == 10**18 + 1  # exact, not float's
    for bad in ("10GB/s", "ten", "5 parsecs"):
        with pytest.raises(PlanError, match="Invalid `size`"):
            parse_bytes(bad, name="size")
    # 25Gb/s is 25 gigabits a second in a network card's specification: it was read as gigabytes,
    # an all-reduce 8x too fast. Refused; a size in lowercase stays bytes.
    for ambiguous, fix in (("25Gb/s", "25Gbit/s for bits or 25GB/s"), ("10gib/s", "10Gibit/s for bits or 10GiB/s")):
        with pytest.raises(PlanError, match=f"Ambiguous `link`; received link='{ambiguous}'.*Fix: write {fix}"):
            parse_bytes(ambiguous, name="link", per_second=True)
    assert parse_bytes("25gbit/s", name="x", per_second=True) == 25e9 / 8 and parse_bytes("500mb", name="x") == 500e6
    assert main(["plan", "--samples", "1000", "--micro-batch", "10", "--link-bandwidth", "25Gb/s"]) == 2
    for bad in ("1.5", "lots", "2.5k3", "1e19", "1e99999999"):
        with pytest.raises(PlanError, match="Invalid `n`.*whole number up to 1e18"):
            parse_count(bad, name="n")
    with pytest.raises(PlanError, match="Invalid `t`"):
        parse_duration("5 weeks", name="t")


# --- memory and checkpoints --------------------------------------------------------------
def test_memory_per_replica_float32_adam():
    p = plan(samples=1000, micro_batch_size=8, params=1_000_000, activation_bytes=1000)
    m = p.memory
    assert m.weights_bytes == 4_000_000 and m.gradients_bytes == 4_000_000
    assert m.optimizer_bytes == 8_000_000  # Adam: 2 slots
    assert m.weight_copies_bytes == 0 and m.accumulator_bytes == 0
    assert m.activations_bytes == 8000
    assert m.total_bytes == 16_008_000


def test_memory_mixed_precision_and_accumulation():
    p = plan(
        samples=1000, micro_batch_size=8, grad_accum_steps=2, params=1_000_000, precision="mixed_bfloat16",
        optimizer_slots=0,
    )
    m = p.memory
    assert m.weights_bytes == 4_000_000  # weights stay float32
    assert m.weight_copies_bytes == 2_000_000  # 16-bit copies for the forward pass
    assert m.accumulator_bytes == 4_000_000
    assert m.optimizer_bytes == 0
    assert m.activations_bytes is None and m.total_bytes is None
    assert m.static_bytes == 14_000_000


def test_checkpoint_size_and_required_bandwidth():
    p = plan(samples=1000, micro_batch_size=10, params=10_000_000, optimizer_slots=2, stall_window="20s")
    assert p.checkpoint_bytes == 10_000_000 * 4 * 3 + CHECKPOINT_OVERHEAD_BYTES
    assert p.required_write_bytes_per_sec == pytest.approx(p.checkpoint_bytes / 20)


def test_young_daly_interval_and_lost_work():
    assert young_daly_interval(write_seconds=50, mtbf=10_000) == pytest.approx(1000)
    p = plan(
        samples=1000, micro_batch_size=10, params=24_750_000, write_bandwidth="1GB/s", mtbf="24h",
        restart_seconds="2m",
    )
    write = (24_750_000 * 12 + CHECKPOINT_OVERHEAD_BYTES) / 1e9
    assert p.checkpoint_write_seconds == pytest.approx(write)
    assert p.checkpoint_interval_seconds == pytest.approx(math.sqrt(2 * write * 86400))
    assert p.lost_seconds_per_failure == pytest.approx(p.checkpoint_interval_seconds / 2 + 120)
    # A run shorter than the interval saves nothing on the way: a failure redoes half of the run.
    short = plan(samples=1000, micro_batch_size=10, params=24_750_000, write_bandwidth="1GB/s", mtbf="24h",
                 restart_seconds="2m", step_time="10ms")
    assert short.train_seconds == pytest.approx(1.0) and short.train_seconds < short.checkpoint_interval_seconds
    assert short.lost_seconds_per_failure == pytest.approx(0.5 + 120)


def test_cli_says_what_a_failure_redoes(capsys):
    assert main(["plan", "--samples", "1000", "--micro-batch", "10", "--params", "1M", "--step-time", "10ms"]) == 0
    assert "training / 2 + restart" in capsys.readouterr().out  # a 1 s run: no save falls due
    assert main(["plan", "--samples", "1.2M", "--epochs", "90", "--micro-batch", "64", "--params", "25M",
                 "--step-time", "180ms"]) == 0
    assert "interval / 2 + restart" in capsys.readouterr().out
    # Without a write bandwidth the write is assumed to take the whole stall window.
    q = plan(samples=1000, micro_batch_size=10, params=1000, stall_window=30, mtbf=3000)
    assert q.checkpoint_interval_seconds == pytest.approx(math.sqrt(2 * 30 * 3000))


def test_slow_storage_is_warned_about():
    p = plan(samples=1000, micro_batch_size=10, params=10**9, write_bandwidth="100MB/s", stall_window=10)
    assert any("below the required" in w for w in p.warnings)


# --- time and scaling ----------------------------------------------------------------------
def test_ring_allreduce_model():
    assert ring_allreduce_seconds(replicas=1, gradient_bytes=4e9, link_bandwidth=1e9) == 0
    assert ring_allreduce_seconds(replicas=2, gradient_bytes=4e9, link_bandwidth=1e9) == pytest.approx(4)
    assert ring_allreduce_seconds(replicas=8, gradient_bytes=4e9, link_bandwidth=1e9) == pytest.approx(7)


def test_time_breakdown():
    p = plan(
        samples=1000, micro_batch_size=5, grad_accum_steps=2, nodes=1, gpus_per_node=4, params=25_000_000,
        step_time="100ms", link_bandwidth="10GB/s", mtbf="1h", write_bandwidth="1GB/s",
    )
    assert p.steps_per_epoch == 25
    assert p.compute_seconds_per_step == pytest.approx(0.2)
    assert p.allreduce_seconds == pytest.approx(2 * 3 / 4 * 100e6 / 10e9)
    assert p.step_seconds == pytest.approx(0.2 + 0.015)
    assert p.train_seconds == pytest.approx(25 * 0.215)
    assert p.checkpoint_interval_steps == int(p.checkpoint_interval_seconds // p.step_seconds)
    assert p.estimated_seconds == pytest.approx(p.train_seconds + p.checkpoint_overhead_seconds)
    assert p.expected_failures == pytest.approx(p.estimated_seconds / 3600)


def test_one_replica_needs_no_params_for_time():
    p = plan(samples=1000, micro_batch_size=10, step_time=0.5)
    assert p.allreduce_seconds == 0 and p.estimated_seconds == pytest.approx(50)
    assert plan(samples=1000, micro_batch_size=10, gpus_per_node=2, step_time=0.5).step_seconds is None


def test_scaling_efficiency_falls_with_communication():
    p = plan(samples=100_000, micro_batch_size=10, params=25_000_000, step_time=0.1, link_bandwidth=1e9)
    points = p.scaling([1, 2, 4, 8])
    assert [pt.gpus for pt in points] == [1, 2, 4, 8]
    assert points[0].efficiency == 1 and points[0].allreduce_seconds == 0
    assert points[1].efficiency == pytest.approx(0.1 / (0.1 + 0.1))  # 2*(1/2)*1e8/1e9 = 0.1 s
    assert all(a.efficiency > b.efficiency for a, b in zip(points, points[1:]))
    assert points[3].train_seconds == pytest.approx((100_000 // 80) * (0.1 + 2 * 7 / 8 * 0.1))
    assert max(pt.gpus for pt in p.scaling()) == 64


# --- CLI ----------------------------------------------------------------------------------
def test_cli_json(capsys):
    argv = ["plan", "--samples", "1000", "--epochs", "1", "--micro-batch", "5", "--grad-accum-steps", "2", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["global_batch_size"] == 10 and out["micro_batch_size"] == 5 and out["grad_accum_steps"] == 2
    assert out["steps_per_epoch"] == 100 and out["total_steps"] == 100
    for key in ("estimated_seconds", "checkpoint_bytes", "required_write_bytes_per_sec", "checkpoint_interval_seconds"):
        assert key in out and out[key] is None  # neither a step time nor params given


def test_cli_json_with_everything(capsys):
    argv = [
        "plan", "--samples", "60k", "--epochs", "3", "--global-batch", "256", "--max-micro-batch", "64",
        "--gpus-per-node", "2", "--params", "1.2M", "--step-time", "20ms", "--precision", "mixed_float16",
        "--activation-bytes", "100kB", "--stall-window", "10s", "--mtbf", "12h", "--write-bandwidth", "200MB/s",
        "--link-bandwidth", "100Gbit/s", "--json",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["grad_accum_steps"], out["micro_batch_size"]) == (2, 64)
    assert out["steps_per_epoch"] == 60_000 // 256 and out["dropped_samples"] == 3 * (60_000 % 256)
    assert out["checkpoint_bytes"] == 1_200_000 * 12 + CHECKPOINT_OVERHEAD_BYTES
    assert out["memory"]["activations_bytes"] == 6_400_000 and out["memory"]["weight_copies_bytes"] == 2_400_000
    assert out["link_bandwidth"] == 12.5e9 and out["mtbf"] == 43200
    assert out["estimated_seconds"] > 0 and out["checkpoint_interval_seconds"] > 0


def test_cli_table_says_how_to_get_the_time(capsys):
    assert main(["plan", "--samples", "1000", "--micro-batch", "10"]) == 0
    out = capsys.readouterr().out
    assert "steps per epoch" in out and "100" in out
    assert "--step-time" in out and "--params" in out


@pytest.mark.parametrize(
    "argv, name",
    [
        # In the command line's words, not plan()'s (micro_batch_size).
        (["--samples", "1000", "--micro-batch", "0"], "--micro-batch"),
        (["--samples", "1000", "--micro-batch", "-3"], "--micro-batch"),
        (["--samples", "ten", "--micro-batch", "2"], "--samples"),
        (["--samples", "1000", "--global-batch", "30", "--micro-batch", "4"], "--global-batch"),
        (["--samples", "1000", "--micro-batch", "4", "--link-bandwidth", "fast"], "--link-bandwidth"),
        (["--micro-batch", "4"], "--samples"),
        # A negative value with a unit reaches tfdist's check (argparse took it for an option).
        (["--samples", "1000", "--micro-batch", "4", "--step-time", "-1s"], "--step-time"),
        (["--samples", "1000", "--micro-batch", "4", "--link-bandwidth", "-1GB/s"], "--link-bandwidth"),
        (["--samples", "1000", "--micro-batch", "4", "--params", "1M", "--stall-window", "-3s"], "--stall-window"),
    ],
)
def test_cli_bad_value_is_one_line_and_exit_2(capsys, argv, name):
    assert main(["plan", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfdist: error: ") and f"`{name}" in lines[0]
    if argv[-1][-1].isalpha():  # a value with a unit is named itself, with the fix
        assert f"received {name}={argv[-1]!r}" in lines[0] and "not negative" in lines[0], lines[0]


def test_python_plan_takes_counts_as_text_as_the_command_line_does():
    from tfdist.planning import plan

    assert (plan(samples="1.2M", params="25.6M", micro_batch_size=32).samples, plan(samples=1000, params="7B",
            micro_batch_size=10).params) == (1_200_000, 7_000_000_000)
    with pytest.raises(PlanError, match=r"Invalid `samples`; received samples='many'"):
        plan(samples="many", micro_batch_size=10)


@pytest.mark.plot
def test_cli_plot_writes_a_png(tmp_path, capsys):
    path = tmp_path / "scaling.png"
    argv = [
        "plan", "--samples", "1.2M", "--epochs", "90", "--micro-batch", "64", "--nodes", "2", "--gpus-per-node",
        "4", "--params", "25.6M", "--step-time", "180ms", "--plot", str(path),
    ]
    assert main(argv) == 0
    assert str(path) in capsys.readouterr().out
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


@pytest.mark.plot
def test_cli_plot_needs_a_step_time(tmp_path, capsys):
    assert main(["plan", "--samples", "1000", "--micro-batch", "10", "--plot", str(tmp_path / "x.png")]) == 2
    assert "--step-time" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_cli_without_measure_does_not_import_tensorflow():
    code = (
        "import sys; from tfdist.cli import main; "
        "rc = main(['plan', '--samples', '1000', '--micro-batch', '5', '--grad-accum-steps', '2', "
        "'--params', '1M', '--step-time', '10ms', '--json']); "
        "assert rc == 0, rc; assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["steps_per_epoch"] == 100


@pytest.mark.parametrize("bad", [["--num-classes", "0"], ["--micro-batch", "0"], ["--measure", "--measure-steps", "0"]])
def test_cli_refuses_a_bad_number_before_importing_tensorflow_for_a_model(bad):
    # They were refused only after TensorFlow's import (10-20 s on a busy machine).
    argv = ["plan", "--samples", "1000", "--micro-batch", "5", "--model", "cnn", *bad]
    code = (f"import sys; from tfdist.cli import main; rc = main({argv!r}); "
            "assert rc == 2, rc; assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith("tfdist: error: Invalid `")


def test_the_error_docs_plan_shows_is_the_one_the_command_prints_in_its_flags(capsys):
    import pathlib

    argv = ["plan", "--samples", "1000", "--global-batch", "100", "--max-micro-batch", "4", "--nodes", "2",
            "--gpus-per-node", "4"]
    assert main(argv) == 2
    line = capsys.readouterr().err.strip()
    assert "`--global-batch`" in line and "(--nodes x --gpus-per-node)" in line and "--max-micro-batch=4" in line
    docs = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "plan.md").read_text()
    assert f"tfdist {' '.join(argv)}" in docs and line in docs


def test_cli_bad_value_in_a_subprocess():
    result = subprocess.run(
        [sys.executable, "-m", "tfdist", "plan", "--samples", "1000", "--micro-batch", "0"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "--micro-batch=0" in result.stderr


_TIMED = ["--samples", "1000", "--micro-batch", "10", "--params", "1M", "--step-time", "10ms"]


def _one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1 and lines[0].startswith("tfdist: error: "), captured.err
    assert "Traceback" not in captured.err and "Fix: " in lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "argv, received",
    [
        (["--samples", "1e400", "--micro-batch", "10"], "--samples='1e400'"),
        ([*_TIMED, "--epochs", "1e400"], "--epochs='1e400'"),
        ([*_TIMED, "--step-time", "1e400"], "--step-time='1e400'"),
        ([*_TIMED, "--mtbf", "1e307d"], "--mtbf='1e307d'"),
        ([*_TIMED, "--restart-time", "1e400"], "--restart-time='1e400'"),
        ([*_TIMED, "--link-bandwidth", "1e400"], "--link-bandwidth='1e400'"),
        ([*_TIMED, "--write-bandwidth", "1e400GB/s"], "--write-bandwidth='1e400GB/s'"),
        ([*_TIMED, "--activation-bytes", "1e400"], "--activation-bytes='1e400'"),
        ([*_TIMED, "--optimizer-slots", "1e1000"], "--optimizer-slots='1e1000'"),
        ([*_TIMED, "--step-time", "1e300", "--epochs", "1e15"], "--step-time=1e+300"),
        ([*_TIMED, "--input-shape", "0,0"], "--input-shape='0,0'"),
        ([*_TIMED, "--input-shape=-1,8"], "--input-shape='-1,8'"),
        ([*_TIMED, "--num-classes", "0"], "--num-classes='0'"),
        ([*_TIMED, "--plot", "scaling.png", "--max-gpus", "-4"], "--max-gpus='-4'"),
        ([*_TIMED, "--plot", "plot.txt"], "--plot='plot.txt'"),
        ([*_TIMED, "--plot", "no-such-folder/x.png"], "--plot='no-such-folder/x.png'"),
    ],
)
def test_cli_out_of_range_value_is_one_line_and_exit_2(capsys, argv, received):
    assert main(["plan", *argv]) == 2
    assert received in _one_line_error(capsys)


def test_cli_plan_with_overflowing_time_names_the_estimate(capsys):
    assert main(["plan", *_TIMED, "--step-time", "1e300", "--epochs", "1e15"]) == 2
    line = _one_line_error(capsys)
    assert "`train_seconds` is inf" in line and "epochs=1000000000000000" in line
    with pytest.raises(PlanError, match="`train_seconds` is inf"):
        Plan(samples=1000, micro_batch_size=10, epochs=10**15, step_time=1e300)


def test_cli_plot_refuses_a_folder_and_writes_nothing(tmp_path, capsys):
    assert main(["plan", *_TIMED, "--plot", str(tmp_path)]) == 2
    assert "a folder" in _one_line_error(capsys)
    assert not tmp_path.with_suffix(".png").exists()


def test_cli_plot_without_matplotlib_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as where it is not installed
    assert main(["plan", *_TIMED, "--plot", str(tmp_path / "x.png")]) == 2
    line = _one_line_error(capsys)
    assert "`--plot` needs matplotlib, which is not installed" in line and f"--plot='{tmp_path / 'x.png'}'" in line
    assert "Fix: pip install 'tfdist[plot]'" in line
    assert not (tmp_path / "x.png").exists()


@pytest.mark.plot
def test_cli_plot_write_failure_is_one_line(tmp_path, capsys, monkeypatch):
    import matplotlib.figure

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", refuse)
    assert main(["plan", *_TIMED, "--plot", str(tmp_path / "x.png")]) == 2
    assert "cannot be written (Permission denied)" in _one_line_error(capsys)


def test_cli_huge_exponent_neither_hangs_nor_crashes():
    result = subprocess.run(
        [sys.executable, "-m", "tfdist", "plan", "--samples", "1e99999999", "--micro-batch", "10"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().count("\n") == 0 and "--samples='1e99999999'" in result.stderr


# --- TensorFlow paths (one test each, small) -----------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("keras_version", ["3", "2"])
def test_saved_model_params_and_measured_step_time(tmp_path, keras_version):
    from tfdist import models

    k = models.keras_module(keras_version)  # saved and loaded with the same Keras
    model = k.Sequential([k.layers.Input((8,)), k.layers.Dense(16), k.layers.BatchNormalization(), k.layers.Dense(3)])
    path = str(tmp_path / "tiny.keras")
    model.save(path)
    p = plan(samples=100, micro_batch_size=4, model=path, measure=True, measure_steps=3, measure_warmup=1,
             keras=keras_version)
    # BatchNormalization: gamma and beta train; the moving mean and variance have no gradients or slots.
    trainable = 8 * 16 + 16 + 2 * 16 + 16 * 3 + 3
    assert p.params == trainable + 2 * 16 and p.trainable_params == trainable and p.keras == keras_version
    assert p.gradient_bytes == trainable * 4 and p.memory.optimizer_bytes == 2 * trainable * 4
    assert p.step_time_source == "measured" and 0 < p.step_time < 5
    assert p.measured_peak_source is not None
    counted = plan(samples=100, micro_batch_size=4, model=path, keras=keras_version)
    assert (counted.params, counted.trainable_params) == (p.params, trainable)


def test_max_gpus_without_plot_is_named_in_a_warning(capsys):
    assert main(["plan", "--samples", "100", "--micro-batch", "10", "--max-gpus", "8"]) == 0
    assert "warning: --max-gpus changes nothing without --plot" in capsys.readouterr().err


def test_trainable_params_bound_gradients_slots_and_the_checkpoint(capsys):
    p = plan(samples=1000, micro_batch_size=10, params="1M", trainable_params="900k", optimizer_slots=2)
    assert p.memory.weights_bytes == 4_000_000 and p.memory.gradients_bytes == 3_600_000
    assert p.memory.optimizer_bytes == 7_200_000 and p.gradient_bytes == 3_600_000
    assert p.checkpoint_bytes == (1_000_000 + 2 * 900_000) * 4 + CHECKPOINT_OVERHEAD_BYTES
    everything = plan(samples=1000, micro_batch_size=10, params="1M")
    assert everything.trained_params == 1_000_000 and everything.gradient_bytes == 4_000_000
    for wrong in ({"trainable_params": 5}, {"params": 4, "trainable_params": 5}):
        with pytest.raises(PlanError, match="Invalid `trainable_params`; received trainable_params=5"):
            plan(samples=1000, micro_batch_size=10, **wrong)
    argv = ["plan", "--samples", "1000", "--micro-batch", "10", "--params", "1M", "--trainable-params", "900k"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "2 x 900,000 trainable x 4 B" in out and "(params + 2 slots x trainable) x 4 B + overhead" in out


@pytest.mark.timeout(120)
def test_a_file_keras_cannot_load_names_the_keras_and_the_other_choice(tmp_path):
    pytest.importorskip("keras")
    path = tmp_path / "broken.keras"
    path.write_text("not a model")
    with pytest.raises(PlanError) as info:
        plan(samples=100, micro_batch_size=4, model=str(path))
    message = str(info.value)
    assert "\n" not in message and "which Keras 3 cannot load" in message and "--keras 2" in message


@pytest.mark.timeout(120)
def test_builtin_model_params(capsys):
    # The linear model: one dense layer from the flattened input to the classes.
    assert plan(samples=100, micro_batch_size=4, model="linear").params == 8 * 8 * 10 + 10  # digits by default
    assert plan(samples=100, micro_batch_size=4, model="linear", input_shape=(28, 28, 1)).params == 7850
    argv = ["plan", "--samples", "100", "--micro-batch", "4", "--model", "linear", "--num-classes", "3", "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["params"] == 8 * 8 * 3 + 3


def _call_counter(keras_module):
    """A pass-through layer of ``keras_module`` that counts its forward passes (micro batches) and rows."""
    import tensorflow as tf

    class CountCalls(keras_module.layers.Layer):
        def build(self, shape):
            self.calls = self.add_weight(name="calls", shape=(), dtype="int64", initializer="zeros", trainable=False)
            self.rows = self.add_weight(name="rows", shape=(), dtype="int64", initializer="zeros", trainable=False)

        def call(self, x):
            self.calls.assign_add(1)
            self.rows.assign_add(tf.cast(tf.shape(x)[0], "int64"))
            return x

    return CountCalls()


@pytest.mark.timeout(120)
def test_measured_step_with_accumulation_is_one_accumulated_step():
    pytest.importorskip("tensorflow")
    tf_keras = pytest.importorskip("tf_keras")
    from tfdist.planning.measure import measure_step_time

    counter = _call_counter(tf_keras)
    model = tf_keras.Sequential([tf_keras.layers.Input((8,)), counter, tf_keras.layers.Dense(3)])
    m = measure_step_time(model=model, micro_batch_size=4, steps=3, warmup=1, grad_accum_steps=2)
    assert m.grad_accum_steps == 2 and m.step_seconds > 0
    # Short steps are timed for about a second: more steps than asked for, after 2 warm-up steps.
    assert m.steps > 3
    steps = int(model.optimizer.iterations)
    assert m.warmup == 2 and steps == m.warmup + m.steps  # one optimizer update per accumulated step
    assert int(counter.calls) == 2 * steps and int(counter.rows) == 8 * steps  # two micro batches of 4 per step


@pytest.mark.timeout(120)
def test_measure_times_a_keras3_builtin_model_in_tfdists_loop(monkeypatch):
    keras = pytest.importorskip("keras")
    from tfdist.planning.measure import measure_step_time
    from tfdist.training import keras3, loop

    ran = []
    real_run_loop = loop.run_loop

    def spy(model, **kwargs):  # the loop tfdist.fit trains Keras 3 models with
        ran.append(model)
        return real_run_loop(model, **kwargs)

    monkeypatch.setattr(loop, "run_loop", spy)
    m = measure_step_time(model="mlp", micro_batch_size=4, steps=3, warmup=1, precision="mixed_bfloat16")
    assert m.keras == "3" and m.step_seconds > 0 and m.strategy == "one_device"
    [net] = ran
    assert keras3.is_keras3(net) and isinstance(net, keras.Model)
    assert net.dtype_policy.name == "mixed_bfloat16"  # built under the policy asked for ...
    assert keras.mixed_precision.global_policy().name == "float32"  # ... which is restored afterwards
    assert m.params == net.count_params() == (8 * 8 * 128 + 128) + (128 * 10 + 10)
    assert int(net.optimizer.iterations) == m.warmup + m.steps  # one run, stopped after the last timed block


@pytest.mark.timeout(120)
def test_measured_keras3_model_object_is_one_accumulated_step_whatever_keras_says():
    pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    from tfdist.planning.measure import measure_step_time

    counter = _call_counter(keras)
    model = keras.Sequential([keras.Input((8,)), counter, keras.layers.Dense(3)])
    # keras="2" is ignored for a model object: its own Keras (3) is measured.
    m = measure_step_time(model=model, micro_batch_size=4, steps=3, warmup=1, grad_accum_steps=2, keras="2")
    assert m.keras == "3" and m.grad_accum_steps == 2 and m.step_seconds > 0 and m.strategy == "none"
    steps = int(model.optimizer.iterations)
    assert m.warmup == 2 and m.steps > 3 and steps == m.warmup + m.steps  # one optimizer update per step
    # Two micro batches of 4 per step, and no pass before the first step (keras3.prepare builds the
    # model and its metrics symbolically, as Keras' fit does under a strategy).
    assert int(counter.calls) == 2 * steps and int(counter.rows) == 8 * steps


@pytest.mark.timeout(120)
def test_cli_measures_with_tf_keras_when_asked(capsys):
    argv = ["plan", "--samples", "100", "--micro-batch", "4", "--model", "linear", "--keras", "2", "--measure",
            "--measure-steps", "3", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["keras"] == "2" and out["step_time_source"] == "measured" and out["step_time"] > 0
    assert out["params"] == 8 * 8 * 10 + 10
