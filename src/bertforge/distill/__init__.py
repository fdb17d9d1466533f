"""Knowledge distillation: a teacher teaches a smaller student, for small fast CPU serving.

    from bertforge.distill import build_recipe, distill
    recipe = build_recipe("task", options={"teacher": "runs/sst2/seed-1", "student": "mini", "data": "glue/SST-2"})
    distill(recipe, "runs/sst2-mini")     # -> runs/sst2-mini/student/: predict, serve, export-onnx take it
    recipe = build_recipe("general", options={"teacher": "models/minilm", "student": "tiny", "data": "data/bert128",
                                              "attention_weight": 1.0, "relation_weight": 1.0, "max_steps": 2000})
    distill(recipe, "runs/tiny-general")  # -> runs/tiny-general/final/: a pre-trained student
    recipe = build_recipe("sentences", options={"teacher": "models/minilm", "student": "tiny", "tokenizer": "runs/tok",
                                                "data": "reviews.txt", "budget_minutes": 3, "lr": 1e-3})
    distill(recipe, "runs/tiny-reviews")  # -> runs/tiny-reviews/final/: an encoder of the teacher's vectors

`job.py` runs a recipe by its mode, `recipe.py` holds the settings (no torch: the command line builds
its options from them), `losses.py` the losses and the modules the loop trains, `run.py` the task and
general runs and what every run shares, `sentences.py` sentence distillation, `layers.py` students cut
from the teacher's layers, `cards.py` the students' model cards. docs/inference.md ("Distillation")
says what each loss does and how to run one.
"""

from __future__ import annotations

from bertforge.distill.job import distill
from bertforge.distill.recipe import (
    MODES,
    DistillLoop,
    DistillLosses,
    DistillOptim,
    DistillRecipe,
    build_recipe,
)

__all__ = ["MODES", "DistillLoop", "DistillLosses", "DistillOptim", "DistillRecipe", "build_recipe", "distill"]
