"""Fine-tuning tasks: GLUE, CoNLL-2003 NER, SQuAD v1.1/v2.0 and SWAG.

Each task module reads its data files into plain dataclasses (`glue`, `ner`, `squad`, `swag`);
`metrics` holds the scores with the official definitions (GLUE, conlleval, the SQuAD scripts).
"""
