"""Every generated section of docs/results*.md, docs/benchmarks*.md, docs/embeddings.md and docs/own-data.md is
what its script renders from the results it saved, to the character (no training, no timing: the scripts' render
functions only).

A study or benchmark owns the text between `<!-- name -->` and `<!-- /name -->` and rewrites it from its
results JSON (experiments/common.py `publish`, benchmarks/common.py `update_doc_section`). A figure typed
into a section by hand, or a section left stale after its render function changed, fails here. Mend it by
rendering the section again from the saved JSON (the script's --render / --summarize path, or
`update_doc_section(name, render(payload))`), never by editing it; prose that a section should keep goes
after its end marker, which a re-render leaves alone.

Each section is rendered the way its script's main() renders it, from the same saved payload. A section
with no script to render it goes in HAND_WRITTEN with the reason, and every marker in these pages must be
in one list or the other, so that a new section cannot go unchecked.

Importing a benchmark script puts benchmarks/ on sys.path, as running it does (the scripts import
`common` and each other by plain name).
"""

from __future__ import annotations

import difflib
import importlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from benchmarks.common import BENCHMARK_PAGES, page_holding, update_doc_section
from experiments.common import RESULT_PAGES

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = (*(page.name for page in (*RESULT_PAGES, *BENCHMARK_PAGES)), "embeddings.md", "own-data.md")
MARKER = re.compile(r"<!-- ([A-Za-z0-9_.-]+) -->")  # a section's start; its end, <!-- /name -->, has a slash

# Settings that these results files predate (their scripts record them now): each is what the section's own
# command line names, or the script's default where it names none. Merged under the saved payload.
NOT_RECORDED: dict[str, dict[str, Any]] = {
    "benchmarks/results/serve_load.json": {"seconds": 30},
    "benchmarks/results/serve_load_precision.json": {"seconds": 15},
    "benchmarks/results/onnx_latency.json": {"blocks": 3},
    "experiments/results/finetune_fullset_random/finetune_baseline.json": {
        "command": "python -m experiments.hf_finetune_baseline --data ../shared/data --threads 1 --full --lr 2e-5 "
                   "--tasks STS-B,MRPC --seeds 1,2,3,4,5 --sampling random --results "
                   "experiments/results/finetune_fullset_random --doc-section finetune-fullset"},
}

# (page, section) -> why no script renders it. Keep it empty where work allows: give the section a render
# function that reads the saved results instead.
HAND_WRITTEN: dict[tuple[str, str], str] = {}


def saved(path: str) -> dict[str, Any]:
    """A results file as its script saved it (plus what NOT_RECORDED says it predates)."""
    return {**NOT_RECORDED.get(path, {}), **json.loads((ROOT / path).read_text(encoding="utf-8"))}


Render = Callable[[ModuleType, dict[str, Any]], str]  # (the script's module, the saved payload) -> the text


@dataclass(frozen=True)
class Generated:
    module: str  # the script, imported as experiments.<name> or benchmarks.<name>
    results: str  # the results file it saved, from the repository root
    render: str | Render = "render"  # the module's function of the payload, or how main() calls it

    @property
    def script(self) -> str:
        return self.module.replace(".", "/") + ".py"

    def text(self) -> str:
        module, payload = importlib.import_module(self.module), saved(self.results)
        return getattr(module, self.render)(payload) if isinstance(self.render, str) else self.render(module, payload)


def _pretrain_run(study: ModuleType, payload: dict[str, Any]) -> str:
    run = Path(payload["run"])  # as --summarize: the run directory the results name
    return study.render(study.run_name(run), payload, study.curves_path(run))


def _precision_accuracy(study: ModuleType, payload: dict[str, Any]) -> str:
    # as --render-only: the command names the saved rows' models
    command = "python -m experiments.precision_accuracy " + " ".join(
        f"--model {row['task']}={row['model']}" for row in payload["rows"])
    return study.render(payload, command)


def _pretrain_bench(bench: ModuleType, payload: dict[str, Any]) -> str:
    # as --render FILE, which also names the section from the file's settings (see the test at the end)
    return bench.saved_section(payload)[1]


E, B = "experiments/results/", "benchmarks/results/"  # where the studies and the benchmarks save their results
RESULTS_PAGE: dict[str, Generated] = {
    "pretrain-run": Generated("experiments.pretrain_vs_scratch", E + "pretrain_vs_scratch.json", _pretrain_run),
    "modern-vs-bert": Generated("experiments.modern_vs_bert", E + "modern_vs_bert.json"),
    "finetune-baseline": Generated("experiments.hf_finetune_baseline", E + "finetune_baseline.json",
                                   lambda m, p: m.render_saved(p, m.RESULTS / "finetune_baseline")),
    # written with --results experiments/results/finetune_fullset_random --doc-section finetune-fullset
    "finetune-fullset": Generated("experiments.hf_finetune_baseline",
                                  E + "finetune_fullset_random/finetune_baseline.json",
                                  lambda m, p: m.render_saved(p, m.RESULTS / "finetune_fullset_random" / "runs")),
    "squad": Generated("experiments.squad_dev_split", E + "squad_dev_split.json"),
    "precision-accuracy": Generated("experiments.precision_accuracy", E + "precision_accuracy.json",
                                    _precision_accuracy),
    "small-file-defaults": Generated("experiments.small_file_defaults", E + "small_file_defaults.json", "report"),
    "electra-vs-mlm": Generated("experiments.electra_vs_mlm", E + "electra_vs_mlm.json"),
    "distill-general": Generated("experiments.distill_students", E + "distill_students.json", "render_general"),
    "distill-students": Generated("experiments.distill_students", E + "distill_students.json", "render_task"),
    "pretraining-tasks": Generated("experiments.pretraining_tasks", E + "pretraining_tasks.json"),
    "model-size": Generated("experiments.model_size", E + "model_size.json"),
    "features-vs-finetuning": Generated("experiments.features_vs_finetuning", E + "features_vs_finetuning.json"),
    "paper-search": Generated("experiments.paper_search", E + "paper_search.json"),
    # adapt_study: one section and one results file per task set
    "adapt-study-conll-2003": Generated("experiments.adapt_study", E + "adapt_study_conll_2003.json", "report"),
    "adapt-study-sst-2": Generated("experiments.adapt_study", E + "adapt_study_sst_2.json", "report"),
    "adapt-study-squad-article": Generated("experiments.adapt_study", E + "adapt_study_squad_article.json", "report"),
    "adapt-study-bert-mini-here-sst-2-squad-article": Generated(
        "experiments.adapt_study", E + "adapt_study_bert_mini_here_sst_2_squad_article.json", "report"),
    "adapt-study-bert-mini-here-conll-2003": Generated(
        "experiments.adapt_study", E + "adapt_study_bert_mini_here_conll_2003.json", "report"),
    "gpu-minutes": Generated("experiments.gpu_minutes", E + "gpu_minutes.json"),
    "quickstart-levers": Generated("experiments.quickstart_levers", E + "quickstart_levers.json"),
    "embed-training": Generated("experiments.embed_training", E + "embed_training.json"),
    # few_shot: one section and one results file per data set (--data sst2, --data articles)
    "few-shot": Generated("experiments.few_shot", E + "few_shot.json"),
    "few-shot-articles": Generated("experiments.few_shot", E + "few_shot_articles.json"),
    "step-floor": Generated("experiments.step_floor", E + "step_floor.json", "report"),
}

BENCHMARKS_PAGE: dict[str, Generated] = {
    "serve-load": Generated("benchmarks.serve_load", B + "serve_load.json", "render_load"),
    "serve-precision": Generated("benchmarks.serve_load", B + "serve_load_precision.json", "render_precision"),
    "onnx-latency": Generated("benchmarks.onnx_latency", B + "onnx_latency.json"),
    "prepare": Generated("benchmarks.prepare_bench", B + "prepare.json"),
    # as --summarize: the saved rows, each with the machine and rounds it was measured with
    "speed": Generated("benchmarks.speed", B + "speed.json", lambda m, p: m.render(m.merge_results([]))),
    # render_precision also reads experiments/results/precision_accuracy.json: what each precision costs
    "speed-precision": Generated("benchmarks.speed", B + "speed_precision.json", "render_precision"),
    "profile-mrpc": Generated("benchmarks.profile_inference", B + "profile_mrpc.json",
                              lambda m, p: m.render("mrpc", p)),
    "profile-sst2": Generated("benchmarks.profile_inference", B + "profile_sst2.json",
                              lambda m, p: m.render("sst2", p)),
    # pretrain_bench: CPU, GPU and compiled GPU figures in files and sections of their own
    "pretrain-bench": Generated("benchmarks.pretrain_bench", B + "pretrain_bench.json", _pretrain_bench),
    "pretrain-bench-gpu": Generated("benchmarks.pretrain_bench", B + "pretrain_bench_gpu.json", _pretrain_bench),
    "pretrain-bench-gpu-compiled": Generated("benchmarks.pretrain_bench", B + "pretrain_bench_gpu_compiled.json",
                                             _pretrain_bench),
    "predict": Generated("benchmarks.predict_bench", B + "predict_bench.json", "doc_section"),
    "modern-memory": Generated("benchmarks.modern_speed", B + "modern_memory.json", "render_memory"),
    "modern-speed": Generated("benchmarks.modern_speed", B + "modern_speed.json"),
    "family-speed": Generated("benchmarks.family_speed", B + "family_speed.json"),
    "onnx-anchor": Generated("benchmarks.onnx_anchor", B + "onnx_anchor.json"),
    "shared-cpu": Generated("benchmarks.shared_cpu", B + "shared_cpu.json"),
    "student-speed": Generated("benchmarks.student_speed", B + "student_speed.json"),
    "adapt-speed": Generated("benchmarks.adapt_speed", B + "adapt_speed.json"),
    "setfit-speed": Generated("benchmarks.setfit_speed", B + "setfit_speed.json"),
    "vector-search": Generated("benchmarks.vector_search", B + "vector_search.json", "section"),
    "int8-agreement": Generated("benchmarks.int8_agreement", B + "int8_agreement.json"),
}

# docs/embeddings.md quotes the few-shot curve from both of few_shot's results files
EMBEDDINGS_PAGE: dict[str, Generated] = {
    "few-shot-curve": Generated("experiments.few_shot", E + "few_shot.json",
                                lambda m, p: m.render_curve(p, saved(E + "few_shot_articles.json"))),
}

# docs/own-data.md: the walk-through's own file and files measured against transformers' Trainer
OWN_DATA_PAGE: dict[str, Generated] = {
    "own-data-classify": Generated("experiments.own_data_classify", E + "own_data_classify.json"),
    # as its summarize(): the tag and the qa results, in that order
    "own-data-tag-qa": Generated("experiments.own_data_tag_qa", E + "own_data_tag.json",
                                 lambda m, p: m.render({"tag": p, "qa": saved(E + "own_data_qa.json")})),
}

SECTIONS: dict[tuple[str, str], Generated] = {
    **{(page_holding(name, RESULT_PAGES).name, name): generated for name, generated in RESULTS_PAGE.items()},
    **{(page_holding(name, BENCHMARK_PAGES).name, name): generated for name, generated in BENCHMARKS_PAGE.items()},
    **{("embeddings.md", name): generated for name, generated in EMBEDDINGS_PAGE.items()},
    **{("own-data.md", name): generated for name, generated in OWN_DATA_PAGE.items()},
}


def section_text(doc: str, name: str) -> str | None:
    """What update_doc_section wrote between the markers: the body, stripped, on lines of its own."""
    found = re.search(rf"<!-- {re.escape(name)} -->\n(.*?)\n<!-- /{re.escape(name)} -->", doc, re.DOTALL)
    return found.group(1) if found else None


def short_diff(page_text: str, rendered: str, limit: int = 40) -> str:
    lines = list(difflib.unified_diff(page_text.splitlines(), rendered.splitlines(), "on the page", "rendered",
                                      lineterm="", n=1))
    return "\n".join(lines[:limit] + ([f"... {len(lines) - limit} more diff lines"] if len(lines) > limit else []))


def test_sections_are_read_as_update_doc_section_writes_them(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n<!-- one -->\nold\n<!-- /one -->\n\nprose after it\n")
    update_doc_section("one", "\n## One\n\n| a |\n|---|\n| 1 |\n\n", page)
    update_doc_section("two", "Two.", page)
    text = page.read_text()
    assert section_text(text, "one") == "## One\n\n| a |\n|---|\n| 1 |"
    assert section_text(text, "two") == "Two."
    assert "prose after it" in text


@pytest.mark.parametrize(("page", "name"), sorted(SECTIONS), ids=[f"{page}:{name}" for page, name in sorted(SECTIONS)])
def test_section_is_what_its_script_renders(page: str, name: str) -> None:
    generated = SECTIONS[page, name]
    on_page = section_text((DOCS / page).read_text(encoding="utf-8"), name)
    assert on_page is not None, f"docs/{page} has no section {name} (markers <!-- {name} --> ... <!-- /{name} -->)"
    rendered = generated.text().strip()
    if on_page != rendered:  # pytest.fail: the short diff alone, not pytest's character-level one besides
        pytest.fail(f"docs/{page} section `{name}` is not what {generated.script} renders from its saved results: "
                    "a hand edit, or a render changed since the results were saved. Render it again from the JSON "
                    "(the script's render path), never by hand; prose to keep goes after the end marker.\n"
                    + short_diff(on_page, rendered), pytrace=False)


@pytest.mark.parametrize("page", PAGES)
def test_every_section_is_checked(page: str) -> None:
    text = (DOCS / page).read_text(encoding="utf-8")
    names = MARKER.findall(text)
    assert len(names) == len(set(names)), f"docs/{page}: a section appears twice: {sorted(names)}"
    for name in names:
        assert section_text(text, name) is not None, f"docs/{page}: <!-- {name} --> has no <!-- /{name} -->"
    known = {name for (where, name) in [*SECTIONS, *HAND_WRITTEN] if where == page}
    unchecked = sorted(set(names) - known)
    assert not unchecked, (f"docs/{page}: sections with no entry in tests/test_generated_sections.py: {unchecked}; "
                           "map each to the script and results file that render it (or, with a reason, to HAND_WRITTEN)")
    gone = sorted(known - set(names))
    assert not gone, f"docs/{page} no longer has the sections {gone}: drop them from the test's lists"


def test_no_section_is_both_rendered_and_hand_written() -> None:
    assert not set(SECTIONS) & set(HAND_WRITTEN)


def test_each_pretrain_bench_file_renders_its_own_section() -> None:
    # pretrain_bench --render FILE picks the section from the file's device and compile settings
    for name, generated in BENCHMARKS_PAGE.items():
        if generated.render is _pretrain_bench:
            section, _ = importlib.import_module(generated.module).saved_section(saved(generated.results))
            assert section == name, f"{generated.results} renders into section {section}, mapped to {name}"
