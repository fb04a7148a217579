"""Turn a corpus into token files once: `python -m reference_train.prepare --out DIR`.

Sources (pick one; the default is the bundled offline corpus, no network):

    python -m reference_train.prepare --out data/offline
    python -m reference_train.prepare --out data/mine --text a.txt b.txt
    python -m reference_train.prepare --out data/mine --jsonl stories.jsonl --text-field text
    python -m reference_train.prepare --out data/tinystories \
        --hf-dataset roneneldan/TinyStories --tokenizer gpt2 --max-docs 100000

Tokenizer: byte-level by default (vocab 257, no download); `--tokenizer DIR`
uses the tokenizer.json of a local folder (a Llama checkpoint's, offline, for
training with --init_from DIR); `--tokenizer NAME` loads a Hugging Face tokenizer
by name. Both need `tokenizers` (or `transformers`) installed.

    python -m reference_train.prepare --out data/llama --text a.txt --tokenizer ~/models/my-llama
The output format is described in reference_train/data.py and docs/training.md.
A run without --data trains on the offline corpus, tokenized here on first use
in each host's cache (`default_data_dir`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .corpus import offline_corpus
from .data import load_meta, read_hf_dataset, read_jsonl, read_text_files, write_token_files
from .errors import DataError
from .tokenizer import make_tokenizer

OFFLINE_STORIES = 2000


def prepare_offline(out: str | Path, n_stories: int = OFFLINE_STORIES, seed: int = 0) -> dict:
    """Write the bundled generated corpus, byte-tokenized, to `out`."""
    docs = offline_corpus(n_stories, seed)
    return write_token_files(docs, make_tokenizer("byte"), out,
                             source=f"offline corpus ({n_stories} generated stories, seed {seed})")


def ensure_offline(out: str | Path) -> Path:
    """The offline token directory at `out`, prepared if it is not there yet."""
    out = Path(out)
    try:
        load_meta(out)
    except DataError:
        prepare_offline(out)
    return out


def default_data_dir() -> Path:
    """Where the bundled offline corpus is tokenized on first use (one copy per host):
    a run without --data trains on it, and exporting its checkpoints looks there."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "reference_train" / "offline-v1"


def ensure_default_data() -> Path:
    """The default data directory, prepared on this host if it is not there yet."""
    return ensure_offline(default_data_dir())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m reference_train.prepare",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory to write meta.json, train.bin, val.bin")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", nargs="+", metavar="FILE",
                     help="plain text files (split on <|endoftext|> when present)")
    src.add_argument("--jsonl", nargs="+", metavar="FILE", help="JSON Lines files")
    src.add_argument("--hf-dataset", metavar="NAME", help="a Hugging Face dataset, e.g. roneneldan/TinyStories")
    p.add_argument("--text-field", default="text", help="field holding the text (JSONL, HF)")
    p.add_argument("--split", default="train", help="HF dataset split to read")
    p.add_argument("--max-docs", type=int, default=None, help="stop after this many documents (HF)")
    p.add_argument("--tokenizer", default="byte",
                   help="'byte' (default), a local folder with a tokenizer.json (e.g. the "
                        "model's for --init_from), or a Hugging Face name, e.g. gpt2")
    p.add_argument("--val-every", type=int, default=20,
                   help="every N-th document goes to validation (default 20, i.e. 5%%)")
    p.add_argument("--stories", type=int, default=OFFLINE_STORIES,
                   help="number of generated stories for the offline corpus")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        tokenizer = make_tokenizer(args.tokenizer)
        if args.text:
            docs, source = read_text_files(args.text), f"text files: {', '.join(args.text)}"
        elif args.jsonl:
            docs = read_jsonl(args.jsonl, args.text_field)
            source = f"JSONL files: {', '.join(args.jsonl)}"
        elif args.hf_dataset:
            docs = read_hf_dataset(args.hf_dataset, args.split, args.text_field, args.max_docs)
            source = f"Hugging Face dataset {args.hf_dataset} ({args.split})"
        else:
            docs = offline_corpus(args.stories)
            source = f"offline corpus ({args.stories} generated stories, seed 0)"
        meta = write_token_files(docs, tokenizer, args.out, args.val_every, source)
    except (DataError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tr, va = meta["splits"]["train"], meta["splits"]["val"]
    print(f"wrote {args.out}: train {tr['tokens']:,} tokens ({tr['documents']} docs), "
          f"val {va['tokens']:,} tokens ({va['documents']} docs), {meta['dtype']}, "
          f"vocab {meta['vocab_size']}, from {source}")
    tok = meta["tokenizer"]
    if tok["kind"] == "folder":
        print(f"tokenizer: {tok['path']}/tokenizer.json (sha256 "
              f"{tok['tokenizer_json_sha256'][:12]}, eos id {tok['eos_id']}), kept in "
              f"{args.out}/tokenizer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
