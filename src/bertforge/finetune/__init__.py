"""Fine-tuning and prediction: a task's declarations (`bertforge.tasks`) driven by THE training loop.

    from bertforge.finetune import finetune, predict
    results = finetune("glue", "RTE", "models/minilm", "data/glue", "runs/rte", seeds=(1, 2, 3), lr=2e-5)
    finetune("classify", None, "models/minilm", None, "runs/reviews",
             task_settings={"train": "reviews.csv", "dev": "reviews-dev.csv"})   # your own files
    predict("glue", "RTE", "runs/rte/seed-1", "data/glue", "submission/")

Exports the run (`finetune`, `run_finetune`: finetune/run.py, which also describes the files a run
writes), its recipe (`FinetuneRecipe`, `build_recipe`: finetune/recipe.py), the model it starts from
(`load_for_task`, `reinitialize_top_layers`: finetune/loading.py), best-model selection
(`main_metric_key`, `BEST_DIR`: finetune/evaluation.py) and `predict` (finetune/prediction.py).
"""

from bertforge.finetune.devsplit import split_holdout
from bertforge.finetune.evaluation import BEST_DIR, main_metric_key
from bertforge.finetune.loading import load_for_task, model_hidden_size, reinitialize_top_layers
from bertforge.finetune.prediction import PredictEngine, RowEngine, predict
from bertforge.finetune.recipe import (
    RESULTS_FILE,
    FinetuneLoop,
    FinetuneOptim,
    FinetuneRecipe,
    build_recipe,
    hyperparameters,
    summarize,
)
from bertforge.finetune.run import finetune, run_finetune
from bertforge.finetune.runrecord import examples_digest
from bertforge.finetune.scores import HOLDOUT_SPLIT
from bertforge.finetuned import TASK_FILE
from bertforge.recipe import RUN_CONFIG_FILE
from bertforge.tasks import FAMILIES

__all__ = ["BEST_DIR", "examples_digest", "FAMILIES", "HOLDOUT_SPLIT", "RESULTS_FILE", "RUN_CONFIG_FILE", "TASK_FILE",
           "FinetuneLoop", "FinetuneOptim", "FinetuneRecipe", "PredictEngine", "RowEngine", "build_recipe", "finetune",
           "hyperparameters", "load_for_task", "main_metric_key", "model_hidden_size", "predict",
           "reinitialize_top_layers", "run_finetune", "split_holdout", "summarize"]
