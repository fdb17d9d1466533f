"""The whole system on bundled data, in one command: raw text -> WordPiece -> shards -> pre-training ->
held-out MLM/SOP scores, a context probe and fill-mask -> teaching -> fine-tuning -> scores. Teaching
continues the pre-trained model on bundled in-domain text (16,000 phrases of SST-2's training split,
labels dropped), learning all-MiniLM-L6-v2's sentence vectors of them (`bertforge distill sentences`):
at a few CPU minutes masked LM alone gives no better start than random weights, and this does. The
fine-tuning is a learning curve: SST-2 dev accuracy against the number of labelled sentences (nested
sub-samples of the bundled 4,000, several seeds at each size), from the model pre-trained and taught
here, from the same model after masked LM alone, from the same architecture's random initialisation
(what pre-training bought at this scale), and from a real
pre-trained checkpoint (all-MiniLM-L6-v2: what pre-training at scale buys), as released and after
`bertforge adapt` has continued it on the text of the training sentences (labels dropped: what
task-adaptive pre-training buys), drawn as `learning_curve.png` and tabulated and read in words in
`report.md`.

    from bertforge.quickstart import quickstart
    report = quickstart("runs/quickstart")            # the "full" budget: <= 15 minutes on 2 CPU cores
    report = quickstart("runs/qs-smoke", budget="smoke")  # the same code path in about a minute (CI)

Each stage writes its outputs under the run directory and a record `stages/<stage>.json` when it
completes; a second run reuses completed stages (whose settings match) and reruns only the rest.
`stages=[...]` runs just those stages; `force=True` reruns them even if complete.

The stages are in `stages.py`, the driver in `run.py`, the bundled inputs in `assets.py`, the
budgets in `settings.py` and the report in `report.py`.
"""

from bertforge.quickstart.assets import bundled_books, minilm_dir, sst2_sample, teach_text
from bertforge.quickstart.report import (
    compare_starts,
    curve_paragraph,
    plot_learning_curve,
    probe_sentence,
    render_report,
    summary_line,
    word_order_points,
)
from bertforge.quickstart.run import quickstart
from bertforge.quickstart.settings import BUDGETS, CURVES, FILL_MASK_PROMPTS, STAGES, Budget, curve_steps
from bertforge.quickstart.stages import epochs_for, stage_subsamples

__all__ = ["BUDGETS", "CURVES", "FILL_MASK_PROMPTS", "STAGES", "Budget", "bundled_books",
           "compare_starts", "curve_paragraph", "curve_steps", "epochs_for", "minilm_dir", "plot_learning_curve",
           "probe_sentence", "quickstart", "render_report", "sst2_sample", "stage_subsamples", "summary_line",
           "teach_text", "word_order_points"]
