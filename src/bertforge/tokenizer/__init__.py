"""The tokenizer of any checkpoint on the `tokenizers` library: load, train (WordPiece), encode, save.

`BertTokenizer` (also named `Tokenizer`, a name that does not say WordPiece) loads every layout the
families' checkpoints ship (vocab.txt, tokenizer.json, vocab.json + merges.txt, SentencePiece
models), encodes texts and pairs the way BERT does, and saves the Hugging Face layout, so that
transformers loads our files and tokenizes identically. Example:

    from bertforge.tokenizer import BertTokenizer
    tokenizer = BertTokenizer.from_pretrained("runs/quickstart/tokenizer")
    batch = tokenizer(["a first text", "a second"], padding=True, return_tensors="pt")

The class is in `tokenizer.py`; `encoding.py` holds the `Encoding` / `BatchEncoding` results,
`files.py` reads the files, `layouts.py` converts the non-WordPiece layouts and `train.py` learns a
WordPiece vocabulary.
"""

from bertforge.tokenizer.encoding import BatchEncoding, Encoding
from bertforge.tokenizer.layouts import TokenizerFileError, TokenizerFilesMissing
from bertforge.tokenizer.tokenizer import BertTokenizer, Tokenizer

__all__ = ["BatchEncoding", "BertTokenizer", "Encoding", "Tokenizer", "TokenizerFileError", "TokenizerFilesMissing"]
