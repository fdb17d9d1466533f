"""Typed recipes: YAML in and out, --config and --set on every job, defaults in one place, runs that
repeat from their own run_config.yaml."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click
import pytest
import torch
import typer
import yaml
from typer.testing import CliRunner

from bertforge import BertConfig, BertModel, BertTokenizer
from bertforge.cli import app
from bertforge.data.prepare import PrepareOptions, prepare
from bertforge.finetune import FinetuneRecipe, build_recipe
from bertforge.pretrain import Recipe, load_recipe
from bertforge.recipe import (
    RecipeError,
    from_mapping,
    load,
    override,
    parse_assignments,
    resolve,
    save,
    settings_of,
)
from bertforge.tasks import FAMILIES, make_task

ROOT = Path(__file__).resolve().parent.parent
TASKS = Path(__file__).parent / "fixtures" / "tasks"
BOOK = Path(__file__).parent / "fixtures" / "gutenberg_sample.txt"
FINETUNE_RECIPES = ROOT / "recipes" / "finetune"
CORPUS = ["the film was a gripping , beautifully acted story .", "a dull , lifeless and terrible film .",
          "the man plays a guitar on the street .", "stocks fell as the market opened ."]


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    corpus = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    corpus.write_text("\n".join(CORPUS * 10) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer.train([corpus], vocab_size=150, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    directory = tmp_path_factory.mktemp("encoder")
    BertModel(config).save_pretrained(directory, tokenizer=tokenizer)
    return directory


# ------------------------------------------------------------------------------------------------
# the machinery
# ------------------------------------------------------------------------------------------------
def test_settings_are_named_by_name_or_path_and_coerced_from_text() -> None:
    recipe = override(FinetuneRecipe(), {"lr": "3e-5", "train.epochs": "2", "seeds": "1,2,3"})
    assert recipe.optim.lr == 3e-5 and recipe.train.epochs == 2.0 and recipe.seeds == [1, 2, 3]
    with pytest.raises(RecipeError, match=r"unknown setting 'learning_rate'"):
        override(FinetuneRecipe(), {"learning_rate": 1e-4})
    with pytest.raises(RecipeError, match=r"did you mean 'epochs'"):
        override(FinetuneRecipe(), {"epoch": 2})
    with pytest.raises(RecipeError, match=r"optim.epochs"):
        override(FinetuneRecipe(), {"optim.epochs": 2})  # a known name on the wrong path
    with pytest.raises(RecipeError, match=r"batch_size: expected a whole number, got 2.5"):
        override(FinetuneRecipe(), {"batch_size": 2.5})
    with pytest.raises(RecipeError, match="unknown task family 'pos'"):
        override(FinetuneRecipe(), {"family": "pos"})


def test_assignments_read_yaml_values_and_bad_ones_are_named() -> None:
    assert parse_assignments(["lr=3e-5", "optim.schedule=cosine", "seeds=[1, 2]"]) == {
        "lr": "3e-5", "optim.schedule": "cosine", "seeds": [1, 2]}  # YAML 1.1 reads 3e-5 as text: coerced later
    with pytest.raises(RecipeError, match="expected key=value"):
        parse_assignments(["lr"])


def test_a_recipe_file_is_checked_and_located(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("family: glue\noptim:\n  lr: [\n")
    with pytest.raises(RecipeError, match=r"bad.yaml:\d+: invalid YAML"):
        load(FinetuneRecipe, bad)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("family: glue\ntrain:\n  epochz: 2\n")
    with pytest.raises(RecipeError, match=r"unknown.yaml: train: unknown setting 'epochz' \(did you mean 'epochs'"):
        load(FinetuneRecipe, unknown)


def test_precedence_is_defaults_then_file_then_options_then_set(tmp_path: Path) -> None:
    config = tmp_path / "r.yaml"
    config.write_text("family: glue\ntask: RTE\noptim:\n  lr: 1.0e-4\ntrain:\n  epochs: 4\n  batch_size: 8\n")
    recipe = resolve(FinetuneRecipe, config, {"epochs": 2.0, "batch_size": 4}, ["batch_size=2"])
    assert (recipe.task, recipe.optim.lr, recipe.train.epochs, recipe.train.batch_size) == ("RTE", 1e-4, 2.0, 2)
    assert recipe.optim.warmup_ratio == 0.1  # untouched: the field's default


def test_a_saved_recipe_loads_back_equal(tmp_path: Path) -> None:
    recipe = override(FinetuneRecipe(), {"task": "MRPC", "lr": 3e-5, "task_settings": {"stride": 16}})
    path = save(recipe, tmp_path / "run_config.yaml", header="a header line")
    assert path.read_text().startswith("# a header line\n")
    assert load(FinetuneRecipe, path) == recipe
    options = PrepareOptions(inputs=["a.txt"], tokenizer="tok", objective="sop")
    assert load(PrepareOptions, save(options, tmp_path / "prepare.yaml")) == options


# ------------------------------------------------------------------------------------------------
# one path for every job: prepare, pretrain and finetune resolve alike
# ------------------------------------------------------------------------------------------------
def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture()
def captured(monkeypatch: pytest.MonkeyPatch) -> dict:
    """What each job's library function is handed by the command line (the jobs themselves do not run)."""
    import bertforge.data.prepare
    import bertforge.finetune
    import bertforge.pretrain

    seen: dict = {}

    def keep(name: str):
        def run(recipe, *args, **kwargs):
            seen[name] = recipe
            raise ValueError("stopped by the test")
        return run

    monkeypatch.setattr(bertforge.data.prepare, "prepare", keep("prepare"))
    monkeypatch.setattr(bertforge.pretrain, "pretrain", keep("pretrain"))
    monkeypatch.setattr(bertforge.finetune, "run_finetune", keep("finetune"))
    return seen


def test_the_three_jobs_resolve_file_options_and_set_through_one_function_in_one_order(
        tmp_path: Path, captured: dict) -> None:
    """Each job: the file sets three settings, an option replaces two of them, --set replaces one of those."""
    runner = CliRunner()
    jobs = {
        "prepare": (["prepare", "--out", str(tmp_path / "o")],
                    "max_seq_length: 64\nworkers: 2\nseed: 1\n", ["--workers", "3", "--seed", "2"], ["seed=3"]),
        "pretrain": (["pretrain", "--data", str(tmp_path), "--out", str(tmp_path / "o")],
                     "model: {preset: tiny}\noptim: {lr: 1.0e-3}\ntrain: {max_steps: 5}\ndata: {batch_size: 8}\n",
                     ["--max-steps", "6", "--batch-size", "4"], ["batch_size=2", "hidden_dropout_prob=0"]),
        "finetune": (["finetune", "glue", "--out", str(tmp_path / "o")],
                     "family: glue\ntask: RTE\noptim: {lr: 1.0e-4}\ntrain: {epochs: 4, batch_size: 8}\n",
                     ["--epochs", "2", "--batch-size", "4"], ["batch_size=2"]),
    }
    for job, (command, text, options, sets) in jobs.items():
        config = _write(tmp_path / f"{job}.yaml", text)
        args = [*command, "--config", str(config), *options, *[a for s in sets for a in ("--set", s)]]
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and "stopped by the test" in result.output, (job, result.output)
        given = {o.lstrip("-").replace("-", "_"): v for o, v in zip(options[::2], options[1::2], strict=True)}
        if job == "finetune":
            expected = build_recipe("glue", config, given, sets)
        else:  # the same function, from the library
            expected = resolve(PrepareOptions if job == "prepare" else Recipe, config, given, sets)
        assert captured[job] == expected, job

    p, r, f = captured["prepare"], captured["pretrain"], captured["finetune"]
    assert (p.max_seq_length, p.workers, p.seed) == (64, 3, 3)
    assert (r.optim.lr, r.train.max_steps, r.data.batch_size, r.model) == (
        1e-3, 6, 2, {"preset": "tiny", "hidden_dropout_prob": 0})
    assert (f.task, f.optim.lr, f.train.epochs, f.train.batch_size) == ("RTE", 1e-4, 2.0, 2)


def test_a_set_of_an_unknown_setting_names_the_accepted_ones(tmp_path: Path, captured: dict) -> None:
    runner = CliRunner()
    for command, some_accepted in [
        (["prepare", "--out", str(tmp_path)], ["max_seq_length", "masking"]),
        (["pretrain", "--data", str(tmp_path), "--out", str(tmp_path)], ["lr", "batch_size", "hidden_size"]),
        (["finetune", "squad", "--out", str(tmp_path)], ["lr", "epochs", "doc_stride"]),
    ]:
        result = runner.invoke(app, [*command, "--set", "zzz_qqq=1"])
        assert result.exit_code == 2 and "unknown setting 'zzz_qqq'; known: " in result.output, result.output
        known = set(result.output.split("known: ")[1].strip().split(", "))
        assert set(some_accepted) <= known, (command, known)
    assert not captured  # nothing ran
    with pytest.raises(RecipeError, match=r"unknown setting 'hidden_sise' \(did you mean 'hidden_size'"):
        resolve(Recipe, "tiny", assignments=["hidden_sise=64"])


def test_every_accepted_spelling_still_works(tmp_path: Path) -> None:
    """Flat names and paths, the model section's fields, a task's own settings; the run_config.yaml
    of a pre-training run with the facts it records."""
    paper = ROOT / "recipes" / "base-paper.yaml"
    for sets in (["hidden_dropout_prob=0", "eval_max_batches=2", "lr=3e-4"],
                 ["model.hidden_dropout_prob=0", "data.eval_max_batches=2", "optim.lr=3e-4"]):
        recipe = resolve(Recipe, paper, assignments=sets)
        assert (recipe.model["hidden_dropout_prob"], recipe.data.eval_max_batches, recipe.optim.lr) == (0, 2, 3e-4)
        assert recipe.model["preset"] == "base" and recipe.source == str(paper)
    assert resolve(Recipe, "mini").model == {"preset": "mini"}
    assert resolve(Recipe, _write(tmp_path / "m.yaml", "model: tiny\n")).model == {"preset": "tiny"}
    recorded = _write(tmp_path / "run_config.yaml", "data_dir: /x\nworld_size: 2\ndataset_options: {}\n"
                                                    "model: {preset: tiny}\ntrain: {max_steps: 3}\n")
    assert load(Recipe, recorded).train.max_steps == 3
    squad = build_recipe("squad", FINETUNE_RECIPES / "squad-v2.0.yaml", {"doc_stride": 64},
                         ["max_query_length=32", "task_settings.n_best=5"])
    assert squad.task_settings == {"doc_stride": 64, "max_query_length": 32, "n_best": 5}
    whole = build_recipe("squad", None, {}, ["task_settings={doc_stride: 96}"])
    assert whole.task_settings == {"doc_stride": 96}
    with pytest.raises(ValueError, match="not `finetune glue`"):
        build_recipe("glue", None, {}, ["family=ner"])


def test_model_fields_do_not_shadow_recipe_settings() -> None:
    """A flat name is either a recipe setting or a field of the model section, never both."""
    for preset in ("tiny", "modern-mini"):
        recipe = resolve(Recipe, preset)
        fields = set(settings_of(Recipe)["model"].keys(recipe))
        assert "hidden_size" in fields and not fields & set(settings_of(Recipe))


def test_a_default_that_depends_on_other_settings_follows_their_final_values(tmp_path: Path) -> None:
    """prepare's dupe_factor (10 static, 1 dynamic) and max_predictions_per_seq (15% of the length)."""
    for options in (resolve(PrepareOptions, None, {"masking": "dynamic", "max_seq_length": 512}),
                    resolve(PrepareOptions, _write(tmp_path / "p.yaml", "masking: dynamic\n"), {},
                        ["max_seq_length=512"])):
        assert (options.dupe_factor, options.max_predictions_per_seq) == (1, 77)
    assert resolve(PrepareOptions).dupe_factor == 10


def test_a_task_family_registered_in_tasks_is_a_finetune_subcommand(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path, captured: dict) -> None:
    from bertforge.tasks.base import Task

    class Toy(Task):
        """Fine-tune a toy task.

        Example: `bertforge finetune toy --model m --data d --out o`
        """

        family = "toy"
        single_task = True
        setting_options = {"window": (int, "Toy window.")}

    class Plain(Task):
        """Fine-tune a plain task (its help: this docstring)."""

        family = "plain"

    monkeypatch.setitem(FAMILIES, "toy", Toy)
    monkeypatch.setitem(FAMILIES, "plain", Plain)
    runner = CliRunner()
    listing = runner.invoke(app, ["finetune", "--help"])
    assert listing.exit_code == 0 and "toy" in listing.output and "plain" in listing.output
    toy = _command("finetune", "toy")
    assert toy.help.startswith("Fine-tune a toy task.") and "--window" in _options(toy)
    assert "--task" not in _options(toy) and "--task" in _options(_command("finetune", "plain"))
    assert _command("finetune", "plain").help == "Fine-tune a plain task (its help: this docstring)."
    result = runner.invoke(app, ["finetune", "toy", "--window", "3", "--set", "lr=1e-4", "--model", "m",
                                 "--data", "d", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "stopped by the test" in result.output, result.output
    recipe = captured["finetune"]
    assert (recipe.family, recipe.task, recipe.task_settings, recipe.optim.lr) == ("toy", "toy", {"window": 3}, 1e-4)
    monkeypatch.delitem(FAMILIES, "toy")
    assert runner.invoke(app, ["finetune", "toy", "--help"]).exit_code != 0


# ------------------------------------------------------------------------------------------------
# defaults in one place
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family, task", [("glue", "RTE"), ("ner", "conll2003"), ("squad", "v2.0"),
                                          ("swag", "swag"), ("classify", "reviews")])
def test_empty_settings_take_the_task_s_declared_defaults(family: str, task: str) -> None:
    spec = make_task(family, task)
    recipe = build_recipe(family, None, {"task": task} if family != "swag" else {}, []).resolved(spec)
    assert recipe.optim.lr == type(spec).default_lr
    assert recipe.train.max_length == type(spec).default_max_length
    assert recipe.train.batch_size == type(spec).default_batch_size
    given = build_recipe(family, None, {"lr": 1e-3, "max_length": 64}, []).resolved(spec)
    assert (given.optim.lr, given.train.max_length) == (1e-3, 64)


def _options(command: click.Command) -> set[str]:
    return {name for param in command.params for name in param.opts if name.startswith("--")}


def _command(*path: str) -> click.Command:
    group = typer.main.get_command(app)
    for name in path:
        group = group.get_command(click.Context(group), name)  # type: ignore[attr-defined]
    return group


COMMAND_ONLY = {"--out", "--config", "--set", "--help", "--data", "--resume", "--init-from", "--quiet", "--overwrite",
                "--frozen", "--strategy", "--revision"}  # --revision: folded into --model as NAME@REVISION


def _setting_options(recipe_cls: type) -> set[str]:
    names = set()
    for setting in settings_of(recipe_cls).values():
        flag = setting.name.replace("_", "-")
        names |= {f"--{flag}", f"--no-{flag}", *[a for a in setting.aliases if a.startswith("--")]}
    return names


@pytest.mark.parametrize("path, recipe_cls, not_on_the_command_line", [
    (("prepare",), PrepareOptions, set()),
    (("pretrain",), Recipe, {"source", "progress", "model"}),
    *[(("finetune", family), FinetuneRecipe, {"family", "task_settings",
                                              # a family of one task has no --task (swag; tag, qa, embed)
                                              *(("task",) if FAMILIES[family].single_task else ()),
                                              *(() if FAMILIES[family].reads_data_dir else ("data",))})
      for family in FAMILIES],
])
def test_command_options_and_recipe_settings_do_not_drift_apart(path, recipe_cls, not_on_the_command_line) -> None:
    command = _command(*path)
    options = _options(command)
    task_options = set()
    if path[0] == "finetune":
        task_options = {f"--{n.replace('_', '-')}" for n in FAMILIES[path[1]].setting_options}
    settings = _setting_options(recipe_cls)
    strays = options - settings - task_options - COMMAND_ONLY
    assert not strays, f"options of `{' '.join(path)}` that are no recipe setting: {sorted(strays)}"
    missing = [s.name for s in settings_of(recipe_cls).values()
               if s.name not in not_on_the_command_line and f"--{s.name.replace('_', '-')}" not in options]
    assert not missing, f"recipe settings with no option on `{' '.join(path)}`: {missing}"


def test_bundled_finetuning_recipes_load_and_name_real_tasks() -> None:
    found = sorted(p.stem for p in FINETUNE_RECIPES.glob("*.yaml"))
    assert {"mrpc", "sst2", "cola", "stsb", "qqp", "mnli", "qnli", "rte", "wnli", "conll2003", "squad-v1.1",
            "squad-v2.0", "swag"} <= set(found)
    for name in found:
        recipe = load(FinetuneRecipe, FINETUNE_RECIPES / f"{name}.yaml")
        make_task(recipe.family, recipe.task, recipe.task_settings)
        assert recipe.optim.lr is not None and recipe.train.epochs > 0
    squad2 = load(FinetuneRecipe, FINETUNE_RECIPES / "squad-v2.0.yaml")
    assert (squad2.train.epochs, squad2.optim.lr, squad2.train.batch_size) == (2, 5e-5, 48)  # the paper's 4.3
    assert load(FinetuneRecipe, FINETUNE_RECIPES / "swag.yaml").train.batch_size == 16


# ------------------------------------------------------------------------------------------------
# runs that repeat from their own run_config.yaml
# ------------------------------------------------------------------------------------------------
def test_finetune_from_a_bundled_recipe_with_set_then_again_from_its_run_config(encoder_dir: Path,
                                                                              tmp_path: Path) -> None:
    runner = CliRunner()
    first = tmp_path / "mrpc"
    result = runner.invoke(app, ["finetune", "glue", "--config", str(FINETUNE_RECIPES / "mrpc.yaml"),
                                 "--set", "lr=3e-5", "--set", "epochs=1", "--batch-size", "4",
                                 "--model", str(encoder_dir), "--data", str(TASKS / "glue"), "--out", str(first)])
    assert result.exit_code == 0, result.output
    saved = yaml.safe_load((first / "run_config.yaml").read_text())
    assert (saved["task"], saved["optim"]["lr"], saved["train"]["epochs"], saved["train"]["batch_size"]) == (
        "MRPC", 3e-5, 1.0, 4)
    assert saved["model"] == str(encoder_dir) and saved["train"]["max_length"] == 128  # resolved, not empty

    again = tmp_path / "again"
    result = runner.invoke(app, ["finetune", "glue", "--config", str(first / "run_config.yaml"), "--out", str(again)])
    assert result.exit_code == 0, result.output
    scores = [json.loads((d / "results.json").read_text())["seeds"][0]["metrics"] for d in (first, again)]
    assert scores[0] == scores[1]
    assert yaml.safe_load((again / "run_config.yaml").read_text()) == saved

    wrong = runner.invoke(app, ["finetune", "ner", "--config", str(first / "run_config.yaml"), "--out", str(again)])
    assert wrong.exit_code == 2 and "not `finetune ner`" in wrong.output
    typo = runner.invoke(app, ["finetune", "glue", "--config", str(first / "run_config.yaml"), "--set", "lrr=1",
                               "--out", str(again)])
    assert typo.exit_code == 2 and "did you mean 'lr'" in typo.output


def test_prepare_records_its_options_and_they_make_the_same_shards(encoder_dir: Path, tmp_path: Path) -> None:
    tokenizer = str(encoder_dir)
    prepare([BOOK], tokenizer, tmp_path / "a", max_seq_length=32, dupe_factor=1, plain_text=True, progress=False)
    recorded = load(PrepareOptions, tmp_path / "a" / "run_config.yaml")
    assert recorded.max_seq_length == 32 and recorded.inputs == [str(BOOK)] and recorded.dupe_factor == 1
    result = CliRunner().invoke(app, ["prepare", "--config", str(tmp_path / "a" / "run_config.yaml"), "--out",
                                      str(tmp_path / "b"), "--quiet"])
    assert result.exit_code == 0, result.output
    datasets = [json.loads((tmp_path / d / "dataset.json").read_text()) for d in "ab"]
    assert datasets[0]["options"] == datasets[1]["options"] and datasets[0]["shards"] == datasets[1]["shards"]
    for name in sorted(p.name for p in (tmp_path / "a" / "train").iterdir()):
        assert (tmp_path / "a" / "train" / name).read_bytes() == (tmp_path / "b" / "train" / name).read_bytes()


def test_pretraining_recipes_still_load_and_take_text_numbers(tmp_path: Path) -> None:
    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        load_recipe(path)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: tiny\noptim:\n  lr: 3e-4\n")  # YAML 1.1 reads 3e-4 as text
    assert load_recipe(recipe).optim.lr == 3e-4
    assert dataclasses.asdict(from_mapping(PrepareOptions, {"objective": "sop"}))["objective"] == "sop"


def test_the_command_line_builds_its_options_without_importing_torch() -> None:
    import subprocess
    import sys

    code = "import sys, bertforge.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
