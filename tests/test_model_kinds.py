"""Every world-model kind of `mbrl.world_models.registry`, through the commands that read its entry: `mbrl model fit
--model NAME`, `mbrl model eval --plot`, `mbrl train --algo mopo` with the fitted model, and `mbrl ope` in it. A new
kind's module and registry line get these tests with no edit here (its entry's `smoke` sizes keep them fast)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from mbrl import config as config_io
from mbrl.cli import main
from mbrl.world_models import registry as model_registry

KINDS = list(model_registry.KINDS)


def _options(kind) -> list[str]:
    """`--SECTION.FIELD VALUE` options of the kind's smoke sizes."""
    out = []
    for section, values in kind.smoke.items():
        for name, value in values.items():
            values_ = [str(v) for v in value] if isinstance(value, (tuple, list)) else [str(value)]
            out += [f"--{section.replace('_', '-')}.{name.replace('_', '-')}", *values_]
    return out


@pytest.fixture(scope="module")
def fitted(hopper_tiny_path, tmp_path_factory):
    """One tiny model of each kind, fitted by `mbrl model fit --model NAME` (shared by the tests of this module)."""
    root = tmp_path_factory.mktemp("kinds")
    out = {}
    for name, kind in model_registry.KINDS.items():
        path = root / name
        assert main(["model", "fit", "--model", name, "--dataset", str(hopper_tiny_path), "--out", str(path),
                     *_options(kind), "--no-progress"]) == 0
        out[name] = path
    return out


@pytest.mark.parametrize("name", KINDS)
def test_model_fit_saves_the_kind_it_was_asked_for(name, fitted):
    kind = model_registry.kind(name)
    assert model_registry.saved_kind(fitted[name]) is kind
    model = model_registry.load_model(fitted[name])
    assert isinstance(model, kind.model_class) and model.is_recurrent == kind.is_recurrent
    assert json.loads((fitted[name] / "model.json").read_text())["format"] == kind.format


@pytest.mark.parametrize("name", KINDS)
def test_model_eval_reports_and_plots_the_kind(name, fitted, capsys):
    capsys.readouterr()
    assert main(["model", "eval", str(fitted[name]), "--plot", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["kind"] == name and report["plots"]
    assert all(path.endswith(".png") for path in report["plots"])
    kind = model_registry.kind(name)
    assert bool(report["open_loop_mse"]) == kind.k_step_error
    assert len(report["members"]) == model_registry.load_model(fitted[name]).num_members


@pytest.fixture(scope="module")
def mopo_runs(fitted, hopper_tiny_path, tmp_path_factory):
    """`mbrl train --algo mopo --world-model DIR` with each kind's model: a run, or the one-line refusal (exit 2) of
    a kind MOPO cannot imagine from single states with."""
    from mbrl.agents import registry

    root = tmp_path_factory.mktemp("mopo")
    smoke = registry.entry("mopo").smoke
    options = [f"--{s.replace('_', '-')}.{n.replace('_', '-')}={v}" for s, values in smoke.items()
               for n, v in values.items() if not isinstance(v, (tuple, list))]
    out = {}
    for name, path in fitted.items():
        run_dir, err = root / name, io.StringIO()
        with contextlib.redirect_stderr(err):
                code = main(["train", "--algo", "mopo", "--dataset", str(hopper_tiny_path), "--world-model", str(path),
                         "--run-dir", str(run_dir), "--schedule.epochs", "1", "--schedule.updates-per-epoch", "5",
                         "--schedule.eval-episodes", "1", "--imagination.rollouts-per-epoch", "16",
                         "--imagination.horizon", "2", "--logging.progress", "False", *options])
        out[name] = (code, run_dir, err.getvalue().strip())
    return out


@pytest.mark.parametrize("name", KINDS)
def test_mopo_trains_with_the_kind_or_refuses_it_in_one_line(name, mopo_runs, capsys):
    code, run_dir, err = mopo_runs[name]
    if model_registry.kind(name).is_recurrent:
        assert code == 2 and len(err.splitlines()) == 1 and "reads a history" in err, err
    else:
        assert code == 0 and (run_dir / "config.json").is_file()
        assert set(config_io.model_sections("mopo")) <= set(json.loads((run_dir / "config.json").read_text()))


@pytest.mark.parametrize("name", KINDS)
def test_ope_estimates_in_the_kind(name, fitted, mopo_runs, hopper_tiny_path, capsys):
    """`mbrl ope RUN --method model --world-model DIR`: an estimate in a Markov kind, a one-line refusal otherwise."""
    runs = [run_dir for code, run_dir, _ in mopo_runs.values() if code == 0]
    capsys.readouterr()
    code = main(["ope", str(runs[0]), "--dataset", str(hopper_tiny_path), "--method", "model", "--world-model",
                 str(fitted[name]), "--starts", "4", "--json"])
    if model_registry.kind(name).is_recurrent:
        assert code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1
    else:
        assert code == 0
        [estimate] = json.loads(capsys.readouterr().out)["estimates"]
        assert estimate["method"] == "model" and estimate["low"] <= estimate["value"] <= estimate["high"]
